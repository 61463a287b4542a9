"""Checkpoints of sharded roles with ``torch.distributed.checkpoint`` (DCP).

Every rank of a group writes only the shards it holds (parameters and optimizer state,
DTensors of any FSDP / TP layout, or plain tensors of a single process); DCP records each
tensor's global shape and each shard's offsets, so a checkpoint written at one layout loads
into another (saved at fsdp dp=2, resumed at tp=2 or on one process): each rank reads the
pieces that overlap its new shards. Tensors are keyed by fully qualified parameter names
(``torch.distributed.checkpoint.state_dict``), the same in every layout.

Atomic: ranks write into ``<url>.tmp``; once DCP has written the metadata (its last step,
after every rank's data), rank 0 moves ``<url>`` aside, renames the temp folder to ``<url>``
and deletes the old one; a barrier ends the call. A crash before the rename leaves the
previous checkpoint intact (a stale ``.tmp`` is removed by the next save). Local paths and
fsspec URLs (``memory://``, ``s3://``, ...) both work; the fsspec store needs a rename.

The frozen reference is not saved: it is rebuilt from its source (model path or tiny seed)
when the run resumes. This module is a library: the driver's checkpoint store decides where
and when (rpeg.runtime.actors.checkpoint); the small per-rank extras (RNG states, versions)
are saved once, from rank 0, as plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from rpeg.runtime.actors.shard_reader import (
    is_local_url,
    local_path,
    named_errors,
    safe_reader,
    single_process_quiet,
    weights_only_planner,
)
from rpeg.runtime.lora import adapter_state_names, has_lora

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemWriter

#: a sharded group's shards in a checkpoint's folder: ``<step folder>/<group>.dcp``
SHARDS_SUFFIX = ".dcp"


def _dist() -> ModuleType | None:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _fs(url: str) -> tuple[Any, str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def _writer(url: str) -> FileSystemWriter:
    from torch.distributed.checkpoint import FileSystemWriter

    if is_local_url(url):
        return FileSystemWriter(local_path(url))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(url)


def _remove(url: str) -> None:
    fs, path = _fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _state(roles: Mapping[str, tuple[nn.Module, Any]]) -> dict[str, Any]:
    """``{role: {"model": sharded sd, "optim": sharded optimizer sd}}`` (FQN keys)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from rpeg.runtime.pipeline import checkpoint_names

    out: dict[str, Any] = {}
    msd: dict[str, Any]
    osd: dict[str, Any] | None
    for name, (module, opt) in roles.items():
        if opt is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            out[name] = {"model": get_model_state_dict(module)}
        else:
            msd, osd = get_state_dict(module, opt)
            if has_lora(module):  # a LoRA policy's shards: its adapters only (docs/lora.md)
                msd = {k: v for k, v in msd.items() if k in adapter_state_names(module)}
            msd, osd = checkpoint_names(module, msd, osd, saving=True)  # pp: tied head
            out[name] = {"model": msd, "optim": osd}
    return out


def save_shards(
    url: str,
    roles: Mapping[str, tuple[nn.Module, Any]],
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Write ``roles`` (``{name: (module, optimizer or None)}``) of this rank to ``url`` with
    DCP, atomically (module doc). ``extra``: small values (tensors, ints, byte strings) saved
    once, from rank 0 (RNG state, policy version). Collective: every rank of the group calls
    it with the same ``url``. Returns ``url``."""
    import torch.distributed.checkpoint as dcp

    dist = _dist()
    rank = dist.get_rank() if dist else 0
    tmp = url.rstrip("/") + ".tmp"
    if rank == 0:
        _remove(tmp)
        if is_local_url(tmp):
            import os

            os.makedirs(local_path(tmp), exist_ok=True)
    if dist:
        dist.barrier()
    state = _state(roles)
    state["extra"] = dict(extra or {})
    with single_process_quiet(dist is None):
        dcp.save(state, storage_writer=_writer(tmp), no_dist=dist is None)
    if rank == 0:
        fs, path = _fs(url)
        _, tpath = _fs(tmp)
        old = path.rstrip("/") + ".old"
        if fs.exists(old):
            fs.rm(old, recursive=True)
        if fs.exists(path):
            fs.mv(path, old, recursive=True)
        fs.mv(tpath, path, recursive=True)
        if fs.exists(old):
            fs.rm(old, recursive=True)
    if dist:
        dist.barrier()
    return url


def load_shards(
    url: str,
    roles: Mapping[str, tuple[nn.Module, Any]],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Load ``url`` (written by :func:`save_shards`, at any layout) into ``roles`` at their
    current layout: each rank reads the slices of its shards; optimizer state follows its
    parameters. ``extra``: a template of the extras to read (same keys and value types as
    saved; tensors of the saved shape). Collective. Returns the loaded extras. Nothing in the
    folder runs code: its metadata and non-tensor values (optimizer hyperparameters, versions)
    are read by rpeg.runtime.actors.shard_reader's restricted readers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_state_dict,
    )

    from rpeg.runtime.pipeline import checkpoint_names

    dist = _dist()
    state = _state(roles)
    state["extra"] = {
        k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in (extra or {}).items()
    }
    safe_reader(url).read_metadata()  # a refused metadata named here: DCP would wrap it
    with single_process_quiet(dist is None), named_errors():
        dcp.load(
            state,
            storage_reader=safe_reader(url),
            planner=weights_only_planner(),
            no_dist=dist is None,
        )
    for name, (module, opt) in roles.items():
        if opt is None:
            set_model_state_dict(module, state[name]["model"])
        else:
            msd, osd = checkpoint_names(
                module, state[name]["model"], state[name]["optim"], saving=False
            )
            set_state_dict(
                module,
                opt,
                model_state_dict=msd,
                optim_state_dict=cast("dict[str, Any]", osd),  # given opt's state: not None
                options=StateDictOptions(strict=not has_lora(module)),  # LoRA: adapters only
            )
    return dict(state["extra"])


def worker_roles(**workers: Any) -> dict[str, tuple[nn.Module, Any]]:
    """``{name: (module, optimizer)}`` of the trainable role workers given (PolicyWorker /
    CriticWorker); frozen ones (no optimizer, the reference) are left out."""
    return {
        name: (w.module, w.optimizer)
        for name, w in workers.items()
        if w is not None and getattr(w, "optimizer", None) is not None
    }


def worker_extras(**workers: Any) -> dict[str, Any]:
    """The small state saved beside the shards: policy versions and the rank-0 generators."""
    out: dict[str, Any] = {}
    for name, w in workers.items():
        if w is None or getattr(w, "optimizer", None) is None:
            continue
        out[f"{name}.generator"] = w.generator.get_state()
        out[f"{name}.policy_version"] = int(getattr(w, "policy_version", 0))
    return out


def restore_extras(extras: Mapping[str, Any], **workers: Any) -> None:
    """Put back what :func:`worker_extras` saved."""
    for name, w in workers.items():
        if w is None or f"{name}.generator" not in extras:
            continue
        w.generator.set_state(extras[f"{name}.generator"])
        if hasattr(w, "policy_version"):
            w.policy_version = int(extras[f"{name}.policy_version"])
