"""What a checkpoint holds and which run may continue it: the model it was written for and
the runtime that wrote it, recorded in every commit marker and compared on resume before
anything starts (:func:`rpeg.runtime.actors.checkpoint.check_resumable`).

* :func:`model_identity` -- the policy's architecture (a model folder's ``config.json``
  shape keys, or the built-in model's ``tiny_shape``) and a separate critic's; not where
  the folders are, so a moved folder still resumes.
* :func:`local_meta` -- the marker fields of a single-process trainer's checkpoint.
* :func:`run_identity` -- the algorithm, the staleness bound and the layout of the
  trainable groups (the parts a checkpoint holds), recorded next to the model.
* :func:`mismatches` -- why a marker's checkpoint cannot continue as this run, unless the
  change is stated (``--allow-change FIELD``, :data:`CHANGEABLE`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import fsspec

from rpeg.errors import Problem

if TYPE_CHECKING:
    from rpeg.compile.step import GroupSpec
    from rpeg.config import RunConfig

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
    if getattr(model, "lora", None) is not None:  # its checkpoints hold adapters only
        out["policy"]["lora"] = model.lora.model_dump()
    if getattr(model, "critic_path", None):
        out["critic"] = _architecture(model.critic_path, None)
    return out


#: what ``--allow-change`` may name, and what resuming with that change means
CHANGEABLE = {
    "algorithm": "the saved weights and optimizer continue under the new algorithm; a critic "
    "the checkpoint lacks starts fresh",
    "staleness": "the saved rollouts in flight are trained at the new bound (those older than "
    "it are dropped by the step scheduler's admission)",
    "layout": "the checkpoint is resharded: every rank of a trainable group loads the saved "
    "rank 0 part of its group (data-parallel replicas only: tp = 1, no fsdp, on both sides)",
    "model": "the saved weights are loaded into another architecture (only a shape-compatible "
    "change loads)",
}


def layout_of(groups: Iterable[GroupSpec]) -> dict[str, str]:
    """The trainable groups' layout as the marker records it: ``{group: "dp{D}xtp{T}"}``
    (``+fsdp`` when sharded) -- what fixes the parts a checkpoint holds."""
    out = {}
    for g in groups:
        if g.trainable:
            dp = g.dp or g.world_size // max(g.tp, 1)
            deg = "".join(f"x{d}{getattr(g, d, 1)}" for d in ("pp", "cp") if getattr(g, d, 1) > 1)
            out[g.name] = f"dp{dp}xtp{g.tp}{deg}" + ("+fsdp" if g.fsdp else "")
    return out


def run_identity(config: RunConfig, groups: Iterable[GroupSpec] | None = None) -> dict[str, Any]:
    """The marker fields a resume compares besides the model: ``algorithm`` (its name),
    ``staleness`` (the bound k) and ``layout`` (:func:`layout_of` the compiled step's
    groups; ``"local"`` for the single-process trainer)."""
    return {
        "algorithm": config.algorithm.name,
        "staleness": int(config.runtime.max_staleness),
        "layout": "local" if groups is None else layout_of(groups),
    }


def local_meta(model: Any, config: Any = None) -> dict[str, Any]:
    """The commit-marker fields of a single-process trainer's checkpoint (the local trainer's
    and the retrain flow's local engine's); with ``config``, its :func:`run_identity`."""
    out: dict[str, Any] = {"engine": "local", "model": model_identity(model)}
    if config is not None:
        out.update(run_identity(config))
    return out


def replica_layout(layout: Any) -> bool:
    """Every trainable group data-parallel replicas (tp 1, no fsdp): one rank's part holds
    the whole group's state."""
    return isinstance(layout, dict) and all(
        v.endswith("xtp1") for v in layout.values() if isinstance(v, str)
    )


def stage_layout(layout: Any) -> bool:
    """Every trainable group pipeline stages over replicas (tp 1, no fsdp, pp > 1): each
    stage takes its tensors from one whole rank's part (rpeg.runtime.pipeline.load_unsplit_state)."""
    import re

    return isinstance(layout, dict) and all(
        re.fullmatch(r"dp\d+xtp1xpp\d+", v) for v in layout.values() if isinstance(v, str)
    )


def context_fsdp_layout(layout: Any) -> bool:
    """Every trainable group FSDP over dp x cp ranks (tp 1, cp > 1: rpeg.runtime.
    context_parallel.context_fsdp): its ranks wrote DCP shards, which load at another layout
    (each rank reads the slices it holds; replicas read whole tensors)."""
    import re

    return isinstance(layout, dict) and all(
        re.fullmatch(r"dp\d+xtp1xcp\d+\+fsdp", v) for v in layout.values() if isinstance(v, str)
    )


def identity_mismatches(
    meta: dict[str, Any], ident: dict[str, Any], allow: tuple[str, ...] = ()
) -> list[Problem]:
    """The fields of :func:`run_identity` that differ from the marker's, unless allowed. A
    layout change is refused even when allowed unless both layouts are replicas. A marker
    written before these fields were recorded cannot be compared: it is refused, naming the
    fields, unless ``allow`` states each (issue 44: another layout then failed 38 s after
    start with ``KeyError: 'g1-rank0.pt'``)."""
    where = f"checkpoint step {meta.get('step')} of run {meta.get('run_id')}"
    out = []
    unrecorded = [f for f in ident if f not in meta and f not in allow]
    if unrecorded:
        flags = " ".join(f"--allow-change {f}" for f in unrecorded)
        out.append(
            Problem(
                "--resume",
                f"{where} has an old commit marker that does not record its "
                f"{', '.join(unrecorded)} (written before rpeg recorded them), so this run "
                f"cannot be checked against it; resume with the run's own settings and state "
                f"it with {flags}, or start a new run",
            )
        )
    for field, now in ident.items():
        if field not in meta or meta[field] == now:
            continue
        was = meta[field]
        if field == "layout" and "local" in (was, now):
            continue  # the other runtime's parts: mismatches says so
        if field in allow:
            if field == "layout" and not (
                now == "local"
                or was == "local"
                or (
                    (replica_layout(was) or context_fsdp_layout(was))
                    and (replica_layout(now) or stage_layout(now))
                )
            ):
                out.append(
                    Problem(
                        "--allow-change",
                        f"layout {was} -> {now}: only data-parallel replicas (tp 1, no "
                        "fsdp) and fsdp over cp ranks (tp 1) reshard on resume, into replicas "
                        "or pipeline stages (tp 1, pp)",
                    )
                )
            continue
        out.append(
            Problem(
                "--resume",
                f"{where} was written with {field} {was!r}, this run has {now!r}; resume with "
                f"the same {field}, or state the change with --allow-change {field} "
                f"({CHANGEABLE[field]})",
            )
        )
    return out


def mismatches(
    meta: dict[str, Any],
    model: Any,
    local: bool | None,
    ident: dict[str, Any] | None = None,
    allow: tuple[str, ...] = (),
) -> list[Problem]:
    """Why the checkpoint of ``meta`` cannot continue as this run: another model (when the
    marker records one), another algorithm, staleness or layout (``ident``:
    :func:`run_identity`; unless ``allow`` names the field), or the other runtime's
    parts."""
    where = f"checkpoint step {meta.get('step')} of run {meta.get('run_id')}"
    out = [] if ident is None else identity_mismatches(meta, ident, allow)
    saved = meta.get("model")
    if model is not None and isinstance(saved, dict) and "model" not in allow:
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
