"""A checkpoint on storage: the step folders (``step-NNNNNNNN``), the part files (state files:
safetensors + JSON, never pickles) and the commit marker written last; reading one back
verified (format, run id, every part's size and sha256), and the checkpoint errors."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

from rpeg.errors import RpegError
from rpeg.runtime.actors.state_file import StateFileError
from rpeg.runtime.actors.state_file import dumps as _state_dumps
from rpeg.runtime.actors.state_file import loads as _state_loads

log = logging.getLogger("rpeg.runtime.actors.checkpoint")


COMMIT = "COMMIT.json"
STEP_RE = re.compile(r"step-(\d{8})$")


def step_folder(step: int) -> str:
    """The folder name of the checkpoint after ``step`` steps (``step-00000010``): the one
    place it is spelled."""
    return f"step-{step:08d}"


def step_url(root: str, step: int) -> str:
    """``<root>/step-NNNNNNNN`` (``root``: a checkpoint URL or path, run folder included)."""
    return f"{root.rstrip('/')}/{step_folder(step)}"


RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FORMAT_VERSION = 2  # 1: torch.save pickles (refused); 2: rpeg state files + run id


class CheckpointError(RpegError):
    """No usable checkpoint, or one that cannot be written."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed for a reason of the storage (``reason``: ``disk_full``,
    ``permission``, ``io``); the partial directory was removed. Not a lost worker."""

    def __init__(self, message: str, reason: str = "io"):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type[CheckpointWriteError], tuple[str, str]]:
        return (type(self), (str(self), self.reason))


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str
    meta: dict[str, Any]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps(obj: Any) -> bytes:
    """A state file (tensors in safetensors, the rest as JSON): no pickle."""
    return _state_dumps(obj)


def loads(data: bytes) -> Any:
    """Parse a state file; a pickle or any other file raises :class:`CheckpointError`."""
    try:
        return _state_loads(data)
    except StateFileError as exc:
        raise CheckpointError(f"checkpoint part refused: {exc}") from None


def new_run_id() -> str:
    """``run-YYYYmmdd-HHMMSS-xxxxxx`` (UTC; sorts by start time)."""
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + uuid.uuid4().hex[:6]


# ------------------------------------------------------------------------------ helpers
def list_dir(fs: Any, root: str, detail: bool) -> list[Any]:
    """``fs.ls(root)``; nothing where ``root`` is missing or no folder."""
    try:
        entries: list[Any] = fs.ls(root, detail=detail)
        return entries
    except (FileNotFoundError, NotADirectoryError):
        return []


def list_steps(fs: Any, root: str) -> list[int]:
    out = []
    for e in list_dir(fs, root, detail=False):
        m = STEP_RE.search(str(e).rstrip("/"))
        if m:
            out.append(int(m.group(1)))
    return sorted(set(out))


def verify_checkpoint(
    fs: Any, d: str, run_id: str | None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    try:
        with fs.open(f"{d}/{COMMIT}", "rb") as fh:
            meta = json.loads(fh.read())
    except FileNotFoundError:
        raise CheckpointError(f"{d}: no {COMMIT} (partial checkpoint)") from None
    except ValueError as exc:
        raise CheckpointError(f"{d}: unreadable {COMMIT}: {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{d}: unreadable {COMMIT}")
    fmt = meta.get("format")
    if fmt != FORMAT_VERSION:
        raise CheckpointError(
            f"{d}: checkpoint format {fmt!r}, expected {FORMAT_VERSION}"
            + (" (format 1 holds pickles, which are never loaded)" if fmt == 1 else "")
        )
    if run_id is not None and meta.get("run_id") != run_id:
        raise CheckpointError(f"{d}: written by run {meta.get('run_id')!r}, not {run_id!r}")
    # where the checkpoint lies (a group's torch.distributed.checkpoint shards sit inside it)
    meta["dir_url"] = fs.unstrip_protocol(d)
    parts = {}
    for name, info in meta.get("files", {}).items():
        if "/" in str(name):
            raise CheckpointError(f"{d}: bad part name {name!r}")
        try:
            with fs.open(f"{d}/{name}", "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise CheckpointError(f"{d}/{name}: missing") from None
        if len(data) != info["bytes"] or sha256_hex(data) != info["sha256"]:
            raise CheckpointError(f"{d}/{name}: checksum mismatch (corrupt checkpoint)")
        parts[name] = data
    return meta, parts


def newest_verified(
    fs: Any, root: str, run_id: str | None
) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    for step in reversed(list_steps(fs, root)):
        try:
            return verify_checkpoint(fs, step_url(root, step), run_id)
        except CheckpointError as exc:
            msg = f"skipping checkpoint step {step}: {exc}; trying the previous one"
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            log.warning(msg)
    return None


def step_state(fs: Any, d: str) -> str:
    try:
        with fs.open(f"{d}/{COMMIT}", "rb") as fh:
            meta = json.loads(fh.read())
    except FileNotFoundError:
        return "partial"
    except ValueError:
        return "corrupt"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        return f"format {meta.get('format') if isinstance(meta, dict) else '?'} (refused)"
    for name, info in meta.get("files", {}).items():
        try:
            if fs.size(f"{d}/{name}") != info.get("bytes"):
                return "corrupt"
        except FileNotFoundError:
            return "corrupt"
    return "complete"
