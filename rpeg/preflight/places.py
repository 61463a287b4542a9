"""Where a run writes, checked before it starts: ``runtime.output_dir``, the checkpoint URL,
files written at the end (``--summary-json``), and ``--resume`` / ``--resume-from`` pointing
at a usable checkpoint of the same algorithm, staleness and layout."""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

from rpeg.config import RunConfig
from rpeg.errors import Problem, ProblemsError

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep


# ------------------------------------------------------------------------------ places
def check_places(config: RunConfig, local: bool | None = None) -> list[Problem]:
    from rpeg.runtime.actors.checkpoint import check_resumable, check_writable
    from rpeg.runtime.run_places import run_place_problems

    rt = config.runtime
    out = _check_dir_writable(rt.output_dir, "runtime.output_dir")
    out += run_place_problems(config)  # memory:// checkpoints, links planted in output_dir
    if rt.checkpoint_url:
        try:
            check_writable(rt.checkpoint_url)
        except ProblemsError as exc:
            out += list(exc.problems)
    from rpeg.runtime.actors.checkpoint_identity import run_identity

    ident = run_identity(config)  # staleness and layout: once the plan is compiled
    if not local:
        ident.pop("layout")
        ident.pop("staleness")
    out += check_resumable(rt, config.model, local, ident)
    return out


def check_resumed_layout(config: RunConfig, compiled: CompiledStep) -> list[Problem]:
    """With ``--resume``: the compiled step's staleness bound and trainable layout against
    the checkpoint's (``--allow-change layout`` reshards data-parallel replicas)."""
    from rpeg.runtime.actors.checkpoint import check_resumable
    from rpeg.runtime.actors.checkpoint_identity import layout_of

    ident = {
        "staleness": int(compiled.staleness),
        "layout": layout_of(compiled.actor_groups),
    }
    return check_resumable(config.runtime, None, None, ident)


def check_file_writable(path: str, where: str) -> list[Problem]:
    """Can the file ``path`` be written (its folder created if missing)?"""
    if os.path.isdir(path):
        return [Problem(where, f"{path!r} is a folder; name a file")]
    return _check_dir_writable(os.path.dirname(os.path.abspath(path)), where)


def _check_dir_writable(path: str, where: str) -> list[Problem]:
    """Can ``path`` be created (if missing) and written? Creates nothing that stays,
    except the folders that the run would create anyway."""
    p = os.path.abspath(path)
    probe_dir = p
    while not os.path.exists(probe_dir):
        parent = os.path.dirname(probe_dir)
        if parent == probe_dir:
            break
        probe_dir = parent
    if os.path.exists(p) and not os.path.isdir(p):
        return [Problem(where, f"{path!r} exists and is not a folder")]
    if not os.path.isdir(probe_dir):
        return [Problem(where, f"{path!r} cannot be created: {probe_dir!r} is not a folder")]
    probe = os.path.join(probe_dir, f".rpeg-write-probe-{uuid.uuid4().hex}")
    try:
        with open(probe, "wb") as fh:
            fh.write(b"ok")
        os.remove(probe)
    except OSError as exc:
        return [Problem(where, f"{path!r} is not writable: {exc.strerror or exc}")]
    return []
