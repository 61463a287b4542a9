"""vLLM (V1 engine) behind :class:`~rpeg.runtime.engines.base.GenerationEngine` (GPU).

``vllm`` is imported only when an engine is built (the ``gpu`` extra); everything here that
does not talk to vLLM (the weight-name mapping, the per-request sampling arguments, the output
conversion, the update protocol over ``LLM.collective_rpc``) runs on CPU and is tested there
against a fake ``LLM``. docs/engine.md ("vLLM") has the account; the API names follow vLLM's
V1 ``LLM`` class:

- prompts are token ids (``vllm.inputs.TokensPrompt``), one ``vllm.SamplingParams`` per
  request carrying that sample's seed and response cap;
- log-probs: the engine is built with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2),
  so the log-prob vLLM reports for a sampled token is taken after temperature scaling, like
  :class:`~rpeg.runtime.engines.torch_engine.TorchEngine`'s. Where that mode is missing, or
  top-k/top-p truncation is on (vLLM's processed values are then of the truncated,
  renormalised distribution), the output says ``logprobs_exact=False`` and the run recomputes
  old log-probs with a trainer forward (``algorithm.recompute_old_logprobs``, checked before
  start by :mod:`rpeg.runtime.engines.choice`);
- weight updates: ``LLM.collective_rpc`` runs :meth:`WeightLoaderExtension.rpeg_load_weights`
  on every worker (one per tensor-parallel rank), which hands the tensors to the worker's
  ``model_runner.model.load_weights`` -- vLLM's own loader, which shards each full tensor for
  its rank and fuses q/k/v and gate/up as its checkpoint loader does;
- colocated plans: built with ``enable_sleep_mode=True``; :meth:`VLLMEngine.sleep` frees the
  KV cache and offloads the weights while the trainer runs, :meth:`VLLMEngine.wake_up` (or
  the next ``generate``) brings them back, and a weight update during sleep wakes only the
  weights, keeping the KV cache released until generation.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from rpeg.errors import RpegError
from rpeg.runtime.engines.base import GenerationOutput, SamplingParams

#: vLLM's engine argument that makes the reported log-probs those of the sampling distribution.
PROCESSED_LOGPROBS = "processed_logprobs"
#: The worker extension vLLM mixes into each of its workers (fully qualified, as vLLM wants).
EXTENSION = f"{__name__}.WeightLoaderExtension"
#: One collective_rpc carries at most this many bytes of weights (bounded host memory).
BUCKET_BYTES = 256 * 2**20

# Module-path segments that wrappers insert into parameter names: FSDP1 and activation
# checkpointing wrappers, torch.compile, DDP, and the actor-critic wrapper (its LM is ``lm``).
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_WRAPPER_PREFIXES = ("module.", "lm.")
# Entries that are no part of the HF causal-LM checkpoint vLLM loads.
_NOT_LM_PREFIXES = ("value_head.",)
_BUFFER_SUFFIXES = (".rotary_emb.inv_freq",)


def _import_vllm():
    try:
        import vllm
    except ImportError:
        raise RpegError(
            "the vLLM engine needs the 'vllm' package (pip install 'rpeg[gpu]' on a CUDA "
            "machine); use runtime.engine: torch (or auto) on CPU"
        ) from None
    return vllm


# --------------------------------------------------------------------------- weight names
def hf_weight_names(
    state_dict: Mapping[str, torch.Tensor], *, tie_word_embeddings: bool
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs in the Hugging Face checkpoint layout that vLLM's
    ``load_weights`` reads, from a trainer state dict (the policy's ``get_weights``).

    Wrapper segments are removed (``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``,
    ``_orig_mod.``, a leading ``module.`` or ``lm.``); the value head and rotary-embedding
    buffers are dropped; ``lm_head.weight`` is dropped when the embeddings are tied (vLLM
    ties it to ``model.embed_tokens.weight``, which is sent). DTensors must already be full
    tensors. Two entries that map to one name are an error (a state dict of two models)."""
    out: dict[str, torch.Tensor] = {}
    for raw, tensor in state_dict.items():
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
            raise RpegError(f"weight name {name!r} comes from two entries (one is {raw!r})")
        out[name] = tensor
    return list(out.items())


def weight_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of ``named`` of at most ``bucket_bytes`` each (a larger tensor goes
    alone), so one update never holds more than a bucket in flight."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


class WeightLoaderExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``): ``self`` is the worker, one
    per tensor-parallel rank, so ``self.model_runner.model`` is that rank's model shard.
    Called by name through ``LLM.collective_rpc`` (no pickled callables)."""

    def rpeg_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=[(n, t.to(device, non_blocking=True)) for n, t in weights])
        return len(weights)


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


# --------------------------------------------------------------------------- the engine
class VLLMEngine:
    """Batched sampling from token-id prompts on a ``vllm.LLM`` (V1).

    ``llm``: a ``vllm.LLM`` (or a stand-in with the same methods, for tests); :meth:`build`
    makes one on a Hugging Face folder, :meth:`from_model` on an in-memory model.
    ``processed_logprobs``: whether that LLM reports processed log-probs (module docstring).
    ``sampling_params_cls``: what makes one request's parameters (``vllm.SamplingParams``)."""

    def __init__(
        self,
        llm: Any,
        *,
        pad_id: int,
        eos_id: int,
        tensor_parallel_size: int = 1,
        tie_word_embeddings: bool = False,
        processed_logprobs: bool = True,
        sleep_mode: bool = False,
        policy_version: int = 0,
        bucket_bytes: int = BUCKET_BYTES,
        sampling_params_cls: Any = None,
    ):
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls  # None: vllm.SamplingParams
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.tensor_parallel_size = tensor_parallel_size
        self.tie_word_embeddings = tie_word_embeddings
        self.processed_logprobs = processed_logprobs
        self.sleep_mode = sleep_mode
        self.policy_version = policy_version
        self.bucket_bytes = bucket_bytes
        self.asleep: set[str] = set()  # "weights" / "kv_cache" released while asleep

    @classmethod
    def build(
        cls,
        model_path: str,
        *,
        pad_id: int,
        eos_id: int,
        tie_word_embeddings: bool,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        sleep_mode: bool = False,
        **llm_kwargs: Any,
    ) -> VLLMEngine:
        """A ``vllm.LLM`` on the Hugging Face folder ``model_path``, token ids in and out."""
        vllm = _import_vllm()
        processed = processed_logprobs_supported(vllm)
        if processed:
            llm_kwargs.setdefault("logprobs_mode", PROCESSED_LOGPROBS)
        llm = vllm.LLM(
            model=model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            enable_sleep_mode=sleep_mode,
            worker_extension_cls=EXTENSION,
            **llm_kwargs,
        )
        return cls(
            llm,
            pad_id=pad_id,
            eos_id=eos_id,
            tensor_parallel_size=tensor_parallel_size,
            tie_word_embeddings=tie_word_embeddings,
            processed_logprobs=processed,
            sleep_mode=sleep_mode,
            sampling_params_cls=vllm.SamplingParams,
        )

    @classmethod
    def from_model(cls, model: Any, *, pad_id: int, eos_id: int, **kwargs: Any) -> VLLMEngine:
        """An engine over an in-memory Hugging Face causal LM (e.g. the built-in tiny model):
        its config and safetensors weights are written to a private temporary folder that
        vLLM loads (``engine.folder``, left for the process's lifetime: vLLM may reread its
        config); later updates go through :meth:`update_weights`."""
        folder = tempfile.mkdtemp(prefix="rpeg-vllm-")
        model.save_pretrained(folder, safe_serialization=True)
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        eng = cls.build(folder, pad_id=pad_id, eos_id=eos_id, tie_word_embeddings=tied, **kwargs)
        eng.folder = folder
        return eng

    # ---------------------------------------------------------------- generation
    def _sampling_params(self, params: SamplingParams, cap: int, seed: int | None):
        make = self.sampling_params_cls or _import_vllm().SamplingParams
        stop = sorted({self.eos_id, *params.stop_token_ids})
        return make(**sampling_kwargs(params, cap, seed, stop))

    def logprobs_exact(self, params: SamplingParams) -> bool:
        """Whether the reported log-probs are the interface's (``softmax(logits / T)``, the
        untruncated distribution): processed mode on and no top-k/top-p truncation."""
        truncated = params.temperature > 0 and (params.top_k > 0 or params.top_p < 1.0)
        return self.processed_logprobs and not truncated

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """One request per prompt; sample ``i`` is seeded ``seed + i`` (None: unseeded)."""
        self.wake_up()
        caps = (
            list(max_new_tokens)
            if max_new_tokens is not None
            else [params.max_new_tokens] * len(prompt_ids)
        )
        if len(caps) != len(prompt_ids):
            raise RpegError(f"{len(caps)} response caps for {len(prompt_ids)} prompts")
        requests = [
            self._sampling_params(params, c, None if seed is None else seed + i)
            for i, c in enumerate(caps)
        ]
        # vllm.inputs.TokensPrompt is a TypedDict: this dict is one
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, requests, use_tqdm=False)
        out = to_generation_output(
            outs, self.pad_id, self.policy_version, logprobs_exact=self.logprobs_exact(params)
        )
        dt = time.perf_counter() - t0
        out.stats.update(gen_s=dt, gen_tokens_per_s=out.stats["gen_tokens"] / max(dt, 1e-9))
        return out

    # ---------------------------------------------------------------- weights
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Load new weights into every worker: ``collective_rpc`` of
        :meth:`WeightLoaderExtension.rpeg_load_weights`, bucket by bucket; each of the
        ``tensor_parallel_size`` workers must confirm every tensor. The prefix cache (KV
        computed with the old weights) is dropped."""
        named = hf_weight_names(state_dict, tie_word_embeddings=self.tie_word_embeddings)
        if "weights" in self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")
        for bucket in weight_buckets(named, self.bucket_bytes):
            done = self.llm.collective_rpc("rpeg_load_weights", args=(bucket,))
            if len(done) != self.tensor_parallel_size or any(d != len(bucket) for d in done):
                raise RpegError(
                    f"weight update reached {len(done)} of {self.tensor_parallel_size} vLLM "
                    f"workers (loaded counts {done}, bucket of {len(bucket)})"
                )
        self.llm.reset_prefix_cache()
        self.policy_version = policy_version

    # ---------------------------------------------------------------- colocation
    def sleep(self, level: int = 1) -> None:
        """Release the GPU for the trainer: level 1 offloads the weights to host memory and
        frees the KV cache; level 2 frees both (the next update must send every weight)."""
        if not self.sleep_mode:
            raise RpegError("this vLLM engine was built without sleep mode (colocated=False)")
        if not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        """Reallocate whatever :meth:`sleep` released (no-op when awake)."""
        if self.asleep:
            self.llm.wake_up(tags=sorted(self.asleep))
            self.asleep = set()
