"""What a checkpoint holds and which run may continue it: the model it was written for and
the runtime that wrote it, recorded in every commit marker and compared on resume before
anything starts (:func:`rpeg.runtime.actors.checkpoint.check_resumable`).

* :func:`model_identity` -- the policy's architecture (a model folder's ``config.json``
  shape keys, or the built-in model's ``tiny_shape``) and a separate critic's; not where
  the folders are, so a moved folder still resumes.
* :func:`local_meta` -- the marker fields of a single-process trainer's checkpoint.
* :func:`mismatches` -- why a marker's checkpoint cannot continue as this run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import fsspec

from rpeg.errors import Problem

#: the one part of a single-process trainer's checkpoint (the distributed runtime writes one
#: part per rank and ``driver.pt``)
TRAINER_PART = "trainer.pt"

#: Hugging Face ``config.json`` keys that fix a decoder's weight names and shapes
ARCHITECTURE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


def _architecture(path: str | None, tiny_shape: Mapping[str, Any] | None) -> dict[str, Any]:
    """A model folder's architecture (its ``config.json``'s :data:`ARCHITECTURE_KEYS`; the
    path itself when unreadable), or the built-in model's shape overrides."""
    if not path:
        return {"tiny_shape": dict(tiny_shape or {})}
    try:
        with fsspec.open(f"{path.rstrip('/')}/config.json", "r") as fh:
            cfg = json.load(fh)
        return {k: cfg[k] for k in ARCHITECTURE_KEYS if k in cfg}
    except (OSError, ValueError):
        return {"path": path}


def model_identity(model: Any) -> dict[str, Any]:
    """What fixes a run's weight names and shapes -- the policy's architecture (a model
    folder's ``config.json`` or the built-in model's ``tiny_shape``) and the critic's when it
    has its own folder -- not where the folders are (a moved folder resumes): written into
    every checkpoint's commit marker and compared on resume (:func:`check_resumable`)."""
    out = {"policy": _architecture(model.path, getattr(model, "tiny_shape", None))}
    if getattr(model, "critic_path", None):
        out["critic"] = _architecture(model.critic_path, None)
    return out


def local_meta(model: Any) -> dict[str, Any]:
    """The commit-marker fields of a single-process trainer's checkpoint (the local trainer's
    and the retrain flow's local engine's)."""
    return {"engine": "local", "model": model_identity(model)}


def mismatches(meta: dict[str, Any], model: Any, local: bool | None) -> list[Problem]:
    """Why the checkpoint of ``meta`` cannot continue as this run: another model (when the
    marker records one), or the other runtime's parts."""
    where = f"checkpoint step {meta.get('step')} of run {meta.get('run_id')}"
    out = []
    saved = meta.get("model")
    if model is not None and isinstance(saved, dict):
        mine = model_identity(model)
        diff = []
        for role in sorted(set(mine) | set(saved)):
            was, now = saved.get(role) or {}, mine.get(role) or {}
            diff += [
                f"{role} {k}={was.get(k)!r} (this config: {now.get(k)!r})"
                for k in sorted(set(was) | set(now))
                if was.get(k) != now.get(k)
            ]
        if diff:
            said = ", ".join(diff)
            out.append(
                Problem(
                    "model",
                    f"{where} holds another model's weights: {said}; resume with the run's "
                    "model settings, or start a new run (no --resume, or a new runtime.run_id)",
                )
            )
    files = set(meta.get("files", {}))
    if local is True and files and TRAINER_PART not in files:
        out.append(
            Problem(
                "--local",
                f"{where} was written by the distributed runtime (no {TRAINER_PART}); "
                "resume it without --local",
            )
        )
    if local is False and TRAINER_PART in files:
        out.append(
            Problem(
                "--resume",
                f"{where} was written by the single-process trainer ({TRAINER_PART}); "
                "resume it with --local",
            )
        )
    return out
