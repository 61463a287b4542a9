"""Atomic checkpoints on any fsspec URL (local path, memory://, s3://, gs://).

Layout under the run's checkpoint URL::

    <url>/step-00000010/<name>.pt     one file per part (rank states, buffer, driver state)
    <url>/step-00000010/COMMIT.json   written last: step, policy version, and the sha256 and
                                      size of every part

A directory without ``COMMIT.json`` is partial (the writer died) and is ignored. A part
whose checksum does not match its commit marker makes the checkpoint corrupt: ``latest()``
warns and falls back to the previous complete one. ``keep_last`` complete checkpoints are
kept; older ones (and partial ones older than the newest commit) are deleted.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import fsspec

from rpeg.errors import ConfigError, Problem, RpegError

log = logging.getLogger(__name__)

COMMIT = "COMMIT.json"
_STEP_RE = re.compile(r"step-(\d{8})$")
FORMAT_VERSION = 1


class CheckpointError(RpegError):
    """No usable checkpoint, or one that cannot be written."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str
    meta: dict[str, Any]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps(obj: Any) -> bytes:
    """torch.save to bytes (tensors, numpy-free python objects, RNG states)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def check_writable(url: str) -> None:
    """Refuse an unwritable checkpoint URL *before* any actor starts (ConfigError)."""
    try:
        fs, root = fsspec.core.url_to_fs(url)
        fs.makedirs(root, exist_ok=True)
        probe = f"{root.rstrip('/')}/.rpeg-write-probe-{uuid.uuid4().hex}"
        with fs.open(probe, "wb") as fh:
            fh.write(b"ok")
        fs.rm(probe)
    except Exception as exc:  # noqa: BLE001 - any failure means "not writable"
        raise ConfigError(
            [
                Problem(
                    "runtime.checkpoint_url",
                    f"{url!r} is not writable: {type(exc).__name__}: {exc}",
                )
            ],
            title="checkpoint location refused",
        ) from None


class CheckpointStore:
    """Writes and finds checkpoints under one fsspec URL."""

    def __init__(self, url: str, keep_last: int = 3):
        self.url = url.rstrip("/")
        self.keep_last = keep_last
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")

    # ---------------------------------------------------------------- paths
    def _dir(self, step: int) -> str:
        return f"{self.root}/step-{step:08d}"

    def _steps(self) -> list[int]:
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            m = _STEP_RE.search(str(e).rstrip("/"))
            if m:
                out.append(int(m.group(1)))
        return sorted(set(out))

    # ---------------------------------------------------------------- write
    def save(
        self, step: int, parts: dict[str, bytes], meta: dict[str, Any] | None = None
    ) -> CheckpointInfo:
        """Write ``parts`` (name -> bytes) then the commit marker; prune old checkpoints."""
        t0 = time.perf_counter()
        d = self._dir(step)
        if self.fs.exists(d):
            self.fs.rm(d, recursive=True)
        self.fs.makedirs(d, exist_ok=True)
        files = {}
        for name, data in parts.items():
            if "/" in name or name == COMMIT:
                raise CheckpointError(f"bad part name {name!r}")
            with self.fs.open(f"{d}/{name}", "wb") as fh:
                fh.write(data)
            files[name] = {"sha256": _sha256(data), "bytes": len(data)}
        commit = {
            "format": FORMAT_VERSION,
            "step": step,
            "created_unix_s": time.time(),
            "files": files,
            **(meta or {}),
        }
        with self.fs.open(f"{d}/{COMMIT}", "wb") as fh:
            fh.write(json.dumps(commit, indent=1, sort_keys=True).encode())
        self.prune()
        commit["write_s"] = time.perf_counter() - t0
        commit["total_bytes"] = sum(f["bytes"] for f in files.values())
        return CheckpointInfo(step, d, commit)

    def prune(self) -> None:
        complete = [s for s in self._steps() if self.fs.exists(f"{self._dir(s)}/{COMMIT}")]
        keep = set(complete[-self.keep_last :])
        newest = max(complete, default=-1)
        for s in self._steps():
            if s in keep:
                continue
            if s in complete or s < newest:
                self.fs.rm(self._dir(s), recursive=True)

    # ---------------------------------------------------------------- read
    def verify(self, step: int) -> tuple[dict[str, Any], dict[str, bytes]]:
        """Read and verify one checkpoint; raise CheckpointError if partial or corrupt."""
        d = self._dir(step)
        try:
            with self.fs.open(f"{d}/{COMMIT}", "rb") as fh:
                meta = json.loads(fh.read())
        except FileNotFoundError:
            raise CheckpointError(f"{d}: no {COMMIT} (partial checkpoint)") from None
        except ValueError as exc:
            raise CheckpointError(f"{d}: unreadable {COMMIT}: {exc}") from None
        parts = {}
        for name, info in meta.get("files", {}).items():
            try:
                with self.fs.open(f"{d}/{name}", "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                raise CheckpointError(f"{d}/{name}: missing") from None
            if len(data) != info["bytes"] or _sha256(data) != info["sha256"]:
                raise CheckpointError(f"{d}/{name}: checksum mismatch (corrupt checkpoint)")
            parts[name] = data
        return meta, parts

    def complete_steps(self) -> list[int]:
        return [s for s in self._steps() if self.fs.exists(f"{self._dir(s)}/{COMMIT}")]

    def latest(self) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """The newest complete, verified checkpoint (warning on each corrupt one skipped);
        None if there is none."""
        for step in reversed(self._steps()):
            try:
                return self.verify(step)
            except CheckpointError as exc:
                msg = f"skipping checkpoint step {step}: {exc}; trying the previous one"
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                log.warning(msg)
        return None
