"""Causal LMs in and out through Hugging Face transformers: a local folder or any fsspec URL
(a remote folder is copied to a local temp dir first, then loaded with safetensors), the
tokenizer checks, the built-in ``rpeg-tiny`` family (:func:`tiny_config`, :func:`create_tiny`),
loading straight onto a device, and :func:`save_pretrained`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.model_io.architectures import TESTED_MODEL_TYPES, config_problems

#: the model types the test suite trains and exports; any causal LM transformers implements
#: is accepted (rpeg.runtime.model_io.architectures.config_problems), custom code never
SUPPORTED_MODEL_TYPES = TESTED_MODEL_TYPES
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


def fetch_folder(url: str, where: str) -> str:
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

    local = fetch_folder(url, where)
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

    probs = config_problems(config, "model")
    if probs:
        raise ConfigError(probs)
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


def model_config(local: str, where: str = "model.path", url: str | None = None):
    """The transformers config of a local model folder, checked: a ``config.json`` and a
    ``model_type`` transformers implements as a causal LM (custom code, ``auto_map``, is
    refused: it is never run)."""
    from transformers import AutoConfig

    url = url or local
    if not Path(local, "config.json").exists():
        raise ConfigError(
            [Problem(where, f"{url!r} has no config.json (not a Hugging Face model folder)")]
        )
    import json
    from types import SimpleNamespace

    try:
        raw = json.loads(Path(local, "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError([Problem(where, f"{url!r}: config.json unreadable: {exc}")]) from None
    fields = raw if isinstance(raw, dict) else {}
    probs = config_problems(SimpleNamespace(**fields), where)  # before transformers reads it
    if probs:
        raise ConfigError(probs)
    cfg = AutoConfig.from_pretrained(local, trust_remote_code=False)  # never run its code
    probs = config_problems(cfg, where)
    if probs:
        raise ConfigError(probs)
    return cfg


def load_model(url: str, dtype: str = "float32", where: str = "model.path", device=None):
    """Load a causal LM (any ``model_type`` transformers implements; safetensors) from a
    folder or fsspec URL;
    onto ``device`` when it is not the CPU without a copy in host memory
    (:func:`load_on_device`)."""
    from transformers import AutoModelForCausalLM

    _quiet()
    local = fetch_folder(url, where)
    cfg = model_config(local, where, url)
    if device is not None and torch.device(device).type != "cpu":
        return load_on_device(local, cfg, dtype, device, where)
    return AutoModelForCausalLM.from_pretrained(
        local, dtype=torch_dtype(dtype), use_safetensors=True, trust_remote_code=False
    )


def load_model_and_tokenizer(
    url: str, dtype: str = "float32", where: str = "model.path", device=None
):
    local = fetch_folder(url, where)
    return load_model(local, dtype, where, device), load_tokenizer(local, where)


def rebuild_rotary(model, device) -> None:
    """Recompute the non-persistent buffers (rotary ``inv_freq``, Gemma's ``embed_scale``) of
    a model materialised with ``to_empty``: they are not in its checkpoint. A rotary module is
    built afresh on ``device``; any other module's buffers are set by its model's own
    ``_init_weights`` (run with that module's parameters swapped for meta placeholders, so
    only buffers are written). A module neither covers is refused (its values would be
    garbage)."""
    persistent = set(model.state_dict())
    owner = _pretrained_of(model)
    for name, mod in model.named_modules():
        own = [b for b, _ in mod.named_buffers(recurse=False)]
        lost = [b for b in own if (f"{name}.{b}" if name else b) not in persistent]
        if not lost:
            continue
        if type(mod).__name__.endswith("RotaryEmbedding") and hasattr(mod, "config"):
            with torch.device(device):  # transformers builds them with torch.arange
                fresh = type(mod)(config=mod.config)
            for b in lost:
                mod._buffers[b] = fresh._buffers[b]
            continue
        if owner is None:
            raise TypeError(f"{type(mod).__name__} {name!r} has buffers {lost} not in checkpoints")
        _init_buffers(owner, mod, lost, name)


def _pretrained_of(model):
    """The first transformers ``PreTrainedModel`` in ``model`` (itself or a wrapped LM)."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def _init_buffers(owner, mod, lost: list[str], name: str) -> None:
    """``owner._init_weights(mod)`` writing ``mod``'s buffers only (its parameters replaced by
    meta tensors for the call, so a loaded or sharded weight is never touched)."""
    saved = dict(mod._parameters)
    for b in lost:  # NaN until set: what _init_weights leaves unset is found below
        if mod._buffers[b].is_floating_point():
            mod._buffers[b].fill_(float("nan"))
    mod._parameters = {
        k: None if v is None else nn.Parameter(torch.empty(v.shape, device="meta"), False)
        for k, v in saved.items()
    }
    try:
        with torch.no_grad():
            owner._init_weights(mod)
    finally:
        mod._parameters = saved
    unset = [
        b for b in lost if mod._buffers[b].is_floating_point() and mod._buffers[b].isnan().any()
    ]
    if unset:
        raise TypeError(
            f"{type(mod).__name__} {name!r}: buffers {unset} are not in checkpoints and the "
            "model's _init_weights does not set them"
        )


def stored_as_converted(local: str, cfg) -> bool:
    """True when the folder's weights are stored under other names or shapes than the model
    built from ``cfg`` holds them, and transformers converts them on load (its checkpoint
    conversion mapping: a mixture-of-experts model's fused ``experts.gate_up_proj`` is
    written as one ``experts.<i>.gate_proj`` ... per expert)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    if not get_checkpoint_conversion_mapping(getattr(cfg, "model_type", None)):
        return False
    from safetensors import safe_open

    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        names = set(AutoModelForCausalLM.from_config(cfg, trust_remote_code=False).state_dict())
    for f in sorted(Path(local).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            if any(k not in names for k in fh.keys()):  # noqa: SIM118
                return True
    return False


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
    if stored_as_converted(local, cfg):  # per-expert files of a fused model: transformers
        model = AutoModelForCausalLM.from_pretrained(  # converts them (on the host, once)
            local, dtype=torch_dtype(dtype), use_safetensors=True, trust_remote_code=False
        )
        model.generation_config.pad_token_id = cfg.pad_token_id
        return model.to(device).eval()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            cfg, dtype=torch_dtype(dtype), trust_remote_code=False
        )
    model.to_empty(device=device)
    model.tie_weights()
    rebuild_rotary(model, device)
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
