"""A checkpoint as a Hugging Face model folder (``rpeg export``).

The policy's weights of a checkpoint -- the single-process trainer's ``trainer.pt``, a
distributed run's rank states, or the torch.distributed.checkpoint shards a sharded (FSDP / TP)
group wrote (``<step folder>/<group>.dcp``, read whole in this one process) -- are loaded into the model's own ``transformers`` class and
written with ``save_pretrained`` (``config.json``, ``model.safetensors``) together with the
tokenizer's files, so ``AutoModelForCausalLM.from_pretrained`` and vLLM load the trained
weights. ``config.json`` and the tokenizer come from the model folder the run trained
(``model.path``, given as ``model_path``) or, for the built-in tiny model, from the shape the
checkpoint's commit marker records. Checkpoint parts are read with the state-file reader
(safetensors + JSON) and shards with rpeg.runtime.actors.shard_reader (DCP's metadata through an
unpickler that builds its own classes only, tensors with ``weights_only``): nothing in them is
executed. A LoRA checkpoint (adapters only, in any of the three) goes through
rpeg.runtime.lora_export with the run's config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.actors.checkpoint import CheckpointError, find_checkpoint, loads
from rpeg.runtime.actors.checkpoint_identity import TRAINER_PART
from rpeg.runtime.actors.shard_checkpoint import SHARDS_SUFFIX

#: key prefixes of a policy module that are not the causal LM's own (the shared value head)
_WRAPPER_PREFIX = "lm."
_VALUE_HEAD_PREFIX = "value_head."
#: the actor's weights in a sharded group's shards (rpeg.runtime.actors.shard_checkpoint)
_SHARDED_POLICY = "actor.model."


def policy_weights(
    parts: Mapping[str, bytes], meta: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """The actor's full weights (LM parameter names) in a checkpoint's parts, or -- for a
    sharded group (``meta``'s ``sharded_groups``) -- in its shards folder."""
    if TRAINER_PART in parts:
        state = loads(parts[TRAINER_PART])["trainer"]["actor"]
        return lm_weights(state["module"])
    for name in sorted(parts):  # rank states: rank 0 of the actor's trainer group first
        if not name.endswith(".pt") or name == "driver.pt":
            continue
        try:
            st = loads(parts[name])
        except CheckpointError:
            continue
        actor = st.get("actor") if isinstance(st, dict) else None
        if isinstance(actor, dict) and isinstance(actor.get("module"), dict):
            return lm_weights(actor["module"])
    meta = meta or {}
    for group in meta.get("sharded_groups") or ():  # the group holding the actor's shards
        from rpeg.runtime.actors.shard_reader import read_tensors

        module = read_tensors(f"{meta['dir_url']}/{group}{SHARDS_SUFFIX}", _SHARDED_POLICY)
        if module:
            return lm_weights(module)
    raise CheckpointError(
        f"no policy weights in the checkpoint at {meta.get('dir_url', '?')} (parts "
        f"{sorted(parts)}, shards of {list(meta.get('sharded_groups') or [])}): it holds "
        "neither a trainer.pt, nor a rank state with the actor's weights, nor a sharded "
        "group's actor shards"
    )


def lm_weights(module_state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A policy module's state as the causal LM's own names (an actor-critic's ``lm.``
    prefix removed, its value head left out)."""
    keys = list(module_state)
    wrapped = keys and all(
        k.startswith(_WRAPPER_PREFIX) or k.startswith(_VALUE_HEAD_PREFIX) for k in keys
    )
    out = {}
    for k, v in module_state.items():
        if wrapped:
            if k.startswith(_VALUE_HEAD_PREFIX):
                continue
            k = k[len(_WRAPPER_PREFIX) :]
        out[k] = v
    return out


def _model_and_tokenizer(meta: Mapping[str, Any], model_path: str | None):
    """A fresh model of the checkpoint's architecture and its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rpeg.runtime.model_io import fetch_folder, load_tokenizer

    if model_path:
        local = fetch_folder(model_path, "--model")
        cfg = AutoConfig.from_pretrained(local, trust_remote_code=False)
        return AutoModelForCausalLM.from_config(cfg), load_tokenizer(model_path, "--model")
    policy = (meta.get("model") or {}).get("policy") or {}
    if "tiny_shape" not in policy:
        raise ConfigError(
            [
                Problem(
                    "--model",
                    "the checkpoint was trained from a model folder: name it (--model PATH, "
                    "or --config with its run config) for config.json and the tokenizer",
                )
            ]
        )
    from rpeg.runtime.model_io import create_tiny

    model, tok = create_tiny(seed=0, **dict(policy["tiny_shape"]))
    return model, tok


def export_checkpoint(
    checkpoint: str,
    out: str,
    *,
    model_path: str | None = None,
    dtype: str | None = None,
    log: Callable[[str], None] | None = None,
    config: Any = None,
    force: bool = False,
) -> str:
    """Write the policy of ``checkpoint`` (a step folder, a run folder, or a checkpoint URL
    holding one run) to the HF folder ``out``; returns the step folder it came from. A LoRA
    checkpoint (adapters only) needs the run's ``config``: rpeg.runtime.lora_export. A
    non-empty ``out`` is refused before the checkpoint is read unless ``force``, and then only
    a previous export's files are replaced (rpeg.runtime.export_out)."""
    from rpeg.runtime.export_out import staged_export

    with staged_export(out, force) as stage:
        where = _export_into(checkpoint, stage, model_path, dtype, log, config)
        for f in Path(stage).rglob("*.safetensors"):  # safetensors writes 0600: others read it
            f.chmod(0o644)
        return where


def _export_into(
    checkpoint: str,
    out: str,
    model_path: str | None,
    dtype: str | None,
    log: Callable[[str], None] | None,
    config: Any,
) -> str:
    from rpeg.runtime.model_io import save_pretrained, torch_dtype

    got = find_checkpoint(checkpoint)
    if got is None:
        raise CheckpointError(not_a_checkpoint(checkpoint))
    meta, parts = got
    weights = policy_weights(parts, meta)
    if any(".lora_" in k for k in weights):
        from rpeg.runtime.lora_export import export_lora

        saved = (meta.get("model") or {}).get("policy", {}).get("lora")
        export_lora(weights, out, config, dtype=dtype, log=log, saved=saved)
        return f"step {meta.get('step')} of run {meta.get('run_id')}"
    model, tok = _model_and_tokenizer(meta, model_path)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(
            f"the checkpoint's weights do not fit the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]} (is --model the folder the run trained?)"
        )
    if dtype:
        model = model.to(torch_dtype(dtype))
    save_pretrained(model, tok, out)
    where = f"step {meta.get('step')} of run {meta.get('run_id')}"
    if log:
        log(f"{where}: {sum(p.numel() for p in model.parameters()):,} parameters")
    return where


def not_a_checkpoint(url: str) -> str:
    """Why ``url`` holds nothing to export: what it is and what export reads."""
    from rpeg.runtime.actors.checkpoint import survey

    found = "; ".join(survey(url)) or "no step-NNNNNNNN folder with a COMMIT.json"
    hint = ""
    if url.rstrip("/").endswith(SHARDS_SUFFIX):
        hint = " (a sharded group's shards alone: name the step folder that holds them)"
    return (
        f"no complete checkpoint at {url}{hint}; found: {found}. rpeg export reads an rpeg "
        "checkpoint: a step folder (COMMIT.json with trainer.pt, rank states or "
        "<group>.dcp shards), a run folder, or a checkpoint URL holding one run"
    )


#: where ``runtime.export_hf`` writes, under ``runtime.output_dir``
HF_DIR = "hf"


def export_dir(config: Any, step: int) -> str:
    """``<output_dir>/hf/step-NNNNNNNN``: the HF folder of the checkpoint after ``step`` steps."""
    import os

    return os.path.join(config.runtime.output_dir, HF_DIR, f"step-{step:08d}")


def export_at_checkpoint(
    config: Any, checkpoint: str, step: int, log: Callable[[str], None] | None = None
) -> str | None:
    """``runtime.export_hf``: the just-committed ``checkpoint`` as an HF folder; returns the
    folder, or None (off, or failed: a warning; the checkpoint is already safe and the run
    goes on)."""
    if not config.runtime.export_hf:
        return None
    import warnings

    out = export_dir(config, step)
    try:
        # force: a recomputed step's folder holds this run's earlier export (its manifest)
        export_checkpoint(checkpoint, out, model_path=config.model.path, config=config, force=True)
    except Exception as exc:  # noqa: BLE001 -- an export never stops the run
        warnings.warn(f"runtime.export_hf: step {step} not exported: {exc}", stacklevel=2)
        return None
    if log:
        log(f"exported step {step} to {out}")
    return out
