"""Finding what to resume: what a checkpoint URL holds (:func:`survey`), the newest verified
checkpoint of any run (:func:`find_checkpoint`), the run id to continue
(:func:`resolve_run_id`) and the checks of ``--resume`` / ``--resume-from`` before anything
starts (:func:`check_resumable`)."""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any

import fsspec

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.actors.checkpoint.layout import (
    COMMIT,
    RUN_RE,
    STEP_RE,
    CheckpointError,
    list_dir,
    list_steps,
    new_run_id,
    newest_verified,
    step_state,
    step_url,
    verify_checkpoint,
)
from rpeg.runtime.actors.checkpoint_identity import mismatches

if TYPE_CHECKING:
    from rpeg.config import RuntimeConfig


def _runs(fs: Any, root: str) -> list[str]:
    """Run folders under a checkpoint URL (folders holding ``step-*`` folders)."""
    out = []
    for e in list_dir(fs, root, detail=True):
        name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
        is_run = e.get("type") == "directory" and RUN_RE.match(name)
        if is_run and not STEP_RE.search(name) and list_steps(fs, f"{root}/{name}"):
            out.append(name)
    return sorted(out)


def survey(url: str) -> list[str]:
    """What a checkpoint URL holds, one line per run (or flat folder): its steps and their
    state (complete / partial / corrupt / refused format)."""
    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    root = root.rstrip("/")
    lines = []
    places = [("(flat)", root)] + [(r, f"{root}/{r}") for r in _runs(fs, root)]
    for label, where in places:
        steps = list_steps(fs, where)
        if not steps:
            continue
        desc = ", ".join(f"step {s} {step_state(fs, step_url(where, s))}" for s in steps)
        lines.append(f"{label}: {desc}")
    if not lines and STEP_RE.search(root):
        lines.append(f"{root}: {step_state(fs, root)}")
    return lines


def find_checkpoint(url: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The newest verified checkpoint at ``url``: a step folder, a run folder, or a
    checkpoint URL holding exactly one run (any run id)."""
    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    root = root.rstrip("/")
    if STEP_RE.search(root):
        try:
            return verify_checkpoint(fs, root, None)
        except CheckpointError as exc:
            warnings.warn(f"--resume-from {url}: {exc}", RuntimeWarning, stacklevel=2)
            return None
    got = newest_verified(fs, root, None)
    if got is not None:
        return got
    runs = _runs(fs, root)
    if len(runs) > 1:
        raise CheckpointError(
            f"{url} holds checkpoints of {len(runs)} runs ({', '.join(runs)}); name one: "
            f"{url.rstrip('/')}/<run_id>"
        )
    return newest_verified(fs, f"{root}/{runs[0]}", None) if runs else None


def resolve_run_id(runtime: RuntimeConfig) -> str:
    """The run id of a run (``runtime``: a :class:`rpeg.config.RuntimeConfig`).

    ``runtime.run_id`` when set; else, for ``--resume`` (without ``--resume-from``), the one
    run with checkpoints at ``runtime.checkpoint_url`` (an error listing them when there
    are several, or listing what was found when there is none); else a new id."""
    if runtime.run_id:
        return runtime.run_id
    if runtime.resume and not runtime.resume_from and runtime.checkpoint_url:
        fs, root = fsspec.core.url_to_fs(runtime.checkpoint_url.rstrip("/"))
        root = root.rstrip("/")
        runs = [r for r in _runs(fs, root) if _complete_any(fs, f"{root}/{r}")]
        if len(runs) == 1:
            return runs[0]
        found = "; ".join(survey(runtime.checkpoint_url) or ["nothing"])
        if len(runs) > 1:
            raise ConfigError(
                [
                    Problem(
                        "runtime.resume",
                        f"{runtime.checkpoint_url} holds checkpoints of {len(runs)} runs "
                        f"({', '.join(runs)}): set runtime.run_id to the one to continue, or "
                        "--resume-from URL",
                    )
                ],
                title="nothing to resume",
            )
        raise ConfigError(
            [
                Problem(
                    "runtime.resume",
                    f"no usable checkpoint at {runtime.checkpoint_url}; found: {found}",
                )
            ],
            title="nothing to resume",
        )
    return new_run_id()


def _complete_any(fs: Any, root: str) -> bool:
    return any(step_state(fs, step_url(root, s)) == "complete" for s in list_steps(fs, root))


def _newest_complete_meta(fs: Any, root: str) -> dict[str, Any] | None:
    """The commit marker of the newest complete step under ``root`` (a run's folder or one
    step's), None if there is none."""
    steps = [root] if STEP_RE.search(root) else [step_url(root, s) for s in list_steps(fs, root)]
    for d in reversed(steps):
        if step_state(fs, d) == "complete":
            with fs.open(f"{d}/{COMMIT}", "rb") as fh:
                meta: dict[str, Any] = json.loads(fh.read())
                return meta
    return None


def check_resumable(
    runtime: Any, model: Any = None, local: bool | None = None, ident: Any = None
) -> list[Problem]:
    """Problems with ``--resume`` / ``--resume-from`` before anything starts (cheap: the
    commit markers and part sizes are read, the checksums at restore time). With ``model``
    (the run's ``ModelConfig``) and ``local`` (which runtime resumes), the newest complete
    checkpoint must hold that model's weights and the parts that runtime reads; with
    ``ident`` (checkpoint_identity.run_identity), the same algorithm, staleness and layout
    unless ``runtime.allow_change`` names the field."""
    allow = tuple(getattr(runtime, "allow_change", None) or ())
    if not (runtime.resume or runtime.resume_from):
        return []
    if not runtime.checkpoint_url and not runtime.resume_from:
        return [Problem("runtime.resume", "needs runtime.checkpoint_url (or --resume-from)")]
    if runtime.resume_from:
        fs, root = fsspec.core.url_to_fs(runtime.resume_from.rstrip("/"))
        root = root.rstrip("/")
        ok = (
            step_state(fs, root) == "complete"
            if STEP_RE.search(root)
            else _complete_any(fs, root)
            or any(_complete_any(fs, f"{root}/{r}") for r in _runs(fs, root))
        )
        if not ok:
            found = "; ".join(survey(runtime.resume_from) or ["nothing"])
            return [
                Problem(
                    "runtime.resume_from",
                    f"no usable checkpoint at {runtime.resume_from}; found: {found}",
                )
            ]
        meta = _newest_complete_meta(fs, root)
        return [] if meta is None else mismatches(meta, model, local, ident, allow)
    try:
        run_id = resolve_run_id(runtime)
    except ConfigError as exc:
        return list(exc.problems)
    fs, root = fsspec.core.url_to_fs(f"{runtime.checkpoint_url.rstrip('/')}/{run_id}")
    if not _complete_any(fs, root.rstrip("/")):
        found = "; ".join(survey(runtime.checkpoint_url) or ["nothing"])
        return [
            Problem(
                "runtime.resume",
                f"run {run_id!r} has no usable checkpoint at {runtime.checkpoint_url}; "
                f"found: {found}",
            )
        ]
    meta = _newest_complete_meta(fs, root.rstrip("/"))
    return [] if meta is None else mismatches(meta, model, local, ident, allow)
