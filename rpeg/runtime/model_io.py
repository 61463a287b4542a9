"""Causal LMs through Hugging Face transformers, value heads, and the built-in tiny model.

* :func:`load_model` / :func:`load_tokenizer` read a local folder or any fsspec URL (a remote
  folder is copied to a local temp dir first, then loaded with safetensors).
* :func:`save_pretrained` writes model + tokenizer to a local folder or an fsspec URL.
* :func:`create_model` builds a random-init model from a ``transformers`` config;
  :func:`tiny_config` is the built-in ``rpeg-tiny`` family (Llama arch).
* :class:`CriticModel` is a separate critic (trunk + scalar value head);
  :class:`ActorCritic` shares the actor's trunk: one forward gives logits and values.
* :func:`lm_logprobs` runs a causal LM and returns per-token log-probs of given labels
  computed chunk by chunk inside the LM head (:class:`TokenLogprobHead`), so the
  full-vocabulary fp32 logits of a micro-batch never exist at once. The computation stays
  inside the LM's own ``forward``: FSDP2's hooks on the LM gather and reduce the head's
  (often tied) weight as for any other forward.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rpeg.errors import ConfigError, Problem

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
REQUIRED_SPECIAL_TOKENS = ("pad_token_id", "eos_token_id")

#: Shape of the built-in ``rpeg-tiny`` model (Llama architecture, char-level vocab of 100).
TINY_SHAPE: dict[str, int] = {
    "vocab_size": 100,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


# --- fsspec helpers ------------------------------------------------------------------------
def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def _fetch_folder(url: str, where: str) -> str:
    """Return a local folder holding the files of ``url`` (copied if it is remote)."""
    if _is_local(url):
        path = _local_path(url)
        if not Path(path).is_dir():
            raise ConfigError([Problem(where, f"model folder {url!r} not found")])
        return path
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    if not fs.exists(root) or not fs.isdir(root):
        raise ConfigError([Problem(where, f"model folder {url!r} not found")])
    tmp = tempfile.mkdtemp(prefix="rpeg-model-")
    root = root.rstrip("/")
    for src in fs.find(root):
        rel = src[len(root) :].lstrip("/")
        dst = Path(tmp, rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(src, str(dst))
    return tmp


def _push_folder(local: str, url: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    for dirpath, _, files in os.walk(local):
        for name in files:
            src = Path(dirpath, name)
            rel = src.relative_to(local).as_posix()
            dst = f"{root}/{rel}"
            if "/" in rel:
                fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(src), dst)


# --- tokenizer -----------------------------------------------------------------------------
def check_tokenizer(tokenizer: Any, where: str = "model.path") -> None:
    """Raise :class:`ConfigError` if the tokenizer lacks pad / eos tokens."""
    missing = [name for name in REQUIRED_SPECIAL_TOKENS if getattr(tokenizer, name, None) is None]
    if missing:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"tokenizer lacks needed special tokens: {', '.join(m.replace('_id', '') for m in missing)} "
                    "(set them in tokenizer_config.json / special_tokens_map.json)",
                )
            ]
        )


def load_tokenizer(url: str, where: str = "model.path"):
    from transformers import AutoTokenizer

    local = _fetch_folder(url, where)
    try:
        tok = AutoTokenizer.from_pretrained(local, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            [Problem(where, f"cannot load a tokenizer from {url!r}: {exc}")]
        ) from None
    check_tokenizer(tok, where)
    tok.padding_side = "left"
    return tok


# --- models --------------------------------------------------------------------------------
def tiny_config(vocab_size: int | None = None, **overrides: int):
    """``transformers.LlamaConfig`` of the built-in ``rpeg-tiny`` model."""
    from transformers import LlamaConfig

    from rpeg.runtime.tokenizer import char_vocab

    shape = dict(TINY_SHAPE, **overrides)
    if vocab_size is not None:
        shape["vocab_size"] = vocab_size
    v = char_vocab()
    return LlamaConfig(
        **shape,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=v["<pad>"],
        bos_token_id=v["<bos>"],
        eos_token_id=v["<eos>"],
        attention_dropout=0.0,
    )


def create_model(config, seed: int | None = 0, dtype: str = "float32"):
    """Random-init causal LM from a transformers config (deterministic under ``seed``)."""
    from transformers import AutoModelForCausalLM

    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            [
                Problem(
                    "model",
                    f"model_type {config.model_type!r} not supported; allowed: {SUPPORTED_MODEL_TYPES}",
                )
            ]
        )
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def create_tiny(seed: int = 0, **overrides: int):
    """(model, tokenizer) of the built-in tiny family, random init."""
    from rpeg.runtime.tokenizer import build_char_tokenizer

    return create_model(tiny_config(**overrides), seed=seed), build_char_tokenizer()


def _quiet() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def load_model(url: str, dtype: str = "float32", where: str = "model.path", device=None):
    """Load a causal LM (Llama / Qwen2 / Qwen3, safetensors) from a folder or fsspec URL;
    onto ``device`` when it is not the CPU without a copy in host memory
    (:func:`load_on_device`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet()
    local = _fetch_folder(url, where)
    if not Path(local, "config.json").exists():
        raise ConfigError(
            [Problem(where, f"{url!r} has no config.json (not a Hugging Face model folder)")]
        )
    cfg = AutoConfig.from_pretrained(local, trust_remote_code=False)  # never run its code
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"model_type {cfg.model_type!r} not supported; allowed: {SUPPORTED_MODEL_TYPES}",
                )
            ]
        )
    if device is not None and torch.device(device).type != "cpu":
        return load_on_device(local, cfg, dtype, device, where)
    return AutoModelForCausalLM.from_pretrained(
        local, dtype=torch_dtype(dtype), use_safetensors=True, trust_remote_code=False
    )


def load_model_and_tokenizer(
    url: str, dtype: str = "float32", where: str = "model.path", device=None
):
    local = _fetch_folder(url, where)
    return load_model(local, dtype, where, device), load_tokenizer(local, where)


def _rebuild_rotary(model, device) -> None:
    """Recompute the non-persistent buffers (rotary ``inv_freq``) of a model materialised
    with ``to_empty``: they are not in its checkpoint. Any other non-persistent buffer is
    refused (its values would be garbage)."""
    persistent = set(model.state_dict())
    for name, mod in model.named_modules():
        own = [b for b, _ in mod.named_buffers(recurse=False)]
        lost = [b for b in own if (f"{name}.{b}" if name else b) not in persistent]
        if not lost:
            continue
        if not type(mod).__name__.endswith("RotaryEmbedding"):
            raise TypeError(f"{type(mod).__name__} {name!r} has buffers {lost} not in checkpoints")
        with torch.device(device):  # transformers builds them with torch.arange
            fresh = type(mod)(config=getattr(mod, "config", model.config))
        for b in lost:
            mod._buffers[b] = fresh._buffers[b]


def load_on_device(local: str, cfg, dtype: str, device, where: str = "model.path"):
    """A causal LM built on the ``meta`` device, materialised on ``device`` (``to_empty``) and
    filled from its safetensors files read straight onto ``device``: the weights never exist
    in host memory (``from_pretrained`` reads them there first unless ``accelerate`` places
    them). Tied weights are tied again; rotary buffers recomputed on ``device``."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    files = sorted(Path(local).glob("*.safetensors"))
    if not files:
        raise ConfigError([Problem(where, f"{local!r} has no .safetensors weights")])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            cfg, dtype=torch_dtype(dtype), trust_remote_code=False
        )
    model.to_empty(device=device)
    model.tie_weights()
    _rebuild_rotary(model, device)
    own = model.state_dict()
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for f in files:
            for k, v in load_file(str(f), device=str(device)).items():
                if k not in own:
                    unexpected.append(k)
                    continue
                own[k].copy_(v)
                loaded.add(k)
    ptrs = {own[k].data_ptr() for k in loaded}
    missing = [k for k in own if k not in loaded and own[k].data_ptr() not in ptrs]
    if missing or unexpected:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"weights do not match the config: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}",
                )
            ]
        )
    model.generation_config.pad_token_id = cfg.pad_token_id
    return model.eval()


def save_pretrained(model, tokenizer, url: str) -> None:
    """Save model (safetensors) and tokenizer to a local folder or an fsspec URL."""
    _quiet()
    if _is_local(url):
        path = _local_path(url)
        Path(path).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        return
    tmp = tempfile.mkdtemp(prefix="rpeg-save-")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _push_folder(tmp, url)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- value heads ---------------------------------------------------------------------------
def trunk_of(model):
    """The decoder trunk (no LM head) of a causal LM."""
    return getattr(model, model.base_model_prefix)


class ValueHead(nn.Module):
    """Scalar value per position: ``hidden [B, T, H] -> values [B, T]``."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)


def _beside(head: nn.Module, lm) -> nn.Module:
    """``head`` on the device and in the dtype of ``lm``'s parameters."""
    p = next(lm.parameters(), None)
    return head if p is None else head.to(device=p.device, dtype=p.dtype)


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # [B, T, V]
    values: torch.Tensor | None  # [B, T]


class CriticModel(nn.Module):
    """A separate critic: a causal-LM trunk plus a value head (the LM head is dropped)."""

    def __init__(self, lm):
        super().__init__()
        self.trunk = trunk_of(lm)
        self.config = lm.config
        self.value_head = _beside(ValueHead(lm.config.hidden_size), lm)

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, keep_last: int = 0
    ) -> ModelOutput:
        """``keep_last > 0``: values of the last ``keep_last`` positions only."""
        h = self.trunk(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        if keep_last:
            h = h[:, -keep_last:]
        return ModelOutput(logits=None, values=self.value_head(h).float())


class ActorCritic(nn.Module):
    """Actor and critic on one trunk: one forward gives logits ``[B,T,V]`` and values ``[B,T]``."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        self.config = lm.config
        self.value_head = _beside(ValueHead(lm.config.hidden_size), lm)

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, keep_last: int = 0
    ) -> ModelOutput:
        """``keep_last > 0``: logits and values of the last ``keep_last`` positions only.
        Runs ``self.lm`` (not its trunk and head separately) so that FSDP's hooks on it fire."""
        req = lm_logprobs(
            self.lm,
            input_ids,
            attention_mask,
            position_ids,
            None,
            LogprobRequest(capture=True, extra={"keep": keep_last}),
        )
        return ModelOutput(logits=req.extra["logits"], values=self.value_head(req.hidden).float())

    def logprobs_and_values(
        self, input_ids, attention_mask, position_ids, labels, request: LogprobRequest
    ) -> tuple[LogprobRequest, torch.Tensor]:
        """Chunked log-probs of ``labels [B,R]`` and values ``[B,R]`` from one forward."""
        request.capture = True
        req = lm_logprobs(self.lm, input_ids, attention_mask, position_ids, labels, request)
        return req, self.value_head(req.hidden[:, :-1]).float()


# --- memory-lean log-probs -----------------------------------------------------------------
@dataclass
class LogprobRequest:
    """What :class:`TokenLogprobHead` computes on the next forward instead of logits.

    ``labels [B,R]``: the tokens the last ``R`` kept positions predict (the head sees
    ``R + 1`` positions and drops the last); ``None`` returns logits as usual (only
    ``capture``). Filled by the head: ``logprobs [B,R]``, ``entropy [B,R]`` or None,
    ``hidden [B,R+1,H]`` (post-norm hidden states, when ``capture``)."""

    labels: torch.Tensor | None = None
    temperature: float = 1.0
    with_entropy: bool = False
    entropy_grad: bool = False
    chunk_positions: int | None = None
    capture: bool = False
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


class TokenLogprobHead(nn.Linear):
    """An ``nn.Linear`` LM head that, while a :class:`LogprobRequest` is set, returns the
    requested tokens' log-probs ``[B,R]`` computed in sequence chunks
    (:func:`rpeg.runtime.algorithms.chunked_token_logprobs`) instead of ``[B,T,V]`` logits.
    Installed by class swap on the loaded head (:func:`install_logprob_head`), so the weight
    and its tying to the embeddings are untouched."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        req: LogprobRequest | None = self.__dict__.get("_rpeg_request")
        if req is None:
            return super().forward(hidden)
        if req.capture:
            req.hidden = hidden
        if req.labels is None:
            return super().forward(hidden)
        from rpeg.runtime.algorithms import chunked_token_logprobs

        lp, ent = chunked_token_logprobs(
            hidden[:, :-1],
            self.weight,
            req.labels,
            req.temperature,
            bias=self.bias,
            with_entropy=req.with_entropy,
            entropy_grad=req.entropy_grad,
            chunk_positions=req.chunk_positions,
        )
        req.logprobs, req.entropy = lp, ent
        return lp


def install_logprob_head(lm) -> TokenLogprobHead:
    """Turn ``lm.lm_head`` (an ``nn.Linear``) into a :class:`TokenLogprobHead` in place."""
    head = lm.lm_head
    if not isinstance(head, TokenLogprobHead):
        if type(head) is not nn.Linear:
            raise TypeError(f"LM head is {type(head).__name__}, expected nn.Linear")
        head.__class__ = TokenLogprobHead
    return head


def lm_logprobs(
    lm,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor | None,
    request: LogprobRequest | None = None,
) -> LogprobRequest:
    """One forward of ``lm`` over ``input_ids [B,P+R]`` keeping the last ``R + 1`` positions
    (``R = labels.shape[1]``, or ``request.extra["keep"]`` without labels); returns the
    filled ``request`` (log-probs of ``labels`` under ``softmax(logits / temperature)``,
    entropy and hidden states as asked)."""
    req = request or LogprobRequest()
    req.labels = labels
    keep = labels.shape[1] + 1 if labels is not None else int(req.extra["keep"])
    head = install_logprob_head(lm)
    head.__dict__["_rpeg_request"] = req
    try:
        out = lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=keep,
            use_cache=False,
        )
    finally:
        head.__dict__.pop("_rpeg_request", None)
    if labels is None:
        req.extra["logits"] = out.logits
    return req
