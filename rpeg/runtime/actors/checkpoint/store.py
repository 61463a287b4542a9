"""Writing and finding one run's checkpoints under one fsspec URL (:class:`CheckpointStore`:
atomic save, pruning, the newest verified one), and refusing an unwritable URL before
anything starts (:func:`check_writable`)."""

from __future__ import annotations

import errno
import json
import logging
import time
import uuid
from typing import Any

import fsspec

from rpeg import defaults
from rpeg.errors import ConfigError, Problem
from rpeg.runtime.actors.checkpoint.finding import find_checkpoint, resolve_run_id, survey
from rpeg.runtime.actors.checkpoint.layout import (
    COMMIT,
    FORMAT_VERSION,
    RUN_RE,
    CheckpointError,
    CheckpointInfo,
    CheckpointWriteError,
    list_steps,
    newest_verified,
    sha256_hex,
    step_url,
    verify_checkpoint,
)

log = logging.getLogger("rpeg.runtime.actors.checkpoint")


def _write_reason(exc: BaseException) -> str:
    no = getattr(exc, "errno", None)
    if no in (errno.ENOSPC, errno.EDQUOT):
        return "disk_full"
    if no in (errno.EACCES, errno.EPERM, errno.EROFS) or isinstance(exc, PermissionError):
        return "permission"
    return "io"


_REASON_TEXT = {
    "disk_full": "disk full (no space left on the device or quota exceeded)",
    "permission": "permission denied (read-only or not writable by this user)",
    "io": "storage error",
}


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
    """Writes and finds checkpoints of one run (``run_id``) under one fsspec URL."""

    def __init__(
        self,
        url: str,
        keep_last: int = defaults.KEEP_LAST,
        *,
        run_id: str | None = None,
        resume_from: str | None = None,
        must_resume: bool = False,
    ):
        if run_id is not None and not RUN_RE.match(run_id):
            raise ConfigError(
                [Problem("runtime.run_id", f"{run_id!r}: letters, digits, '.', '_', '-' only")]
            )
        self.base = url.rstrip("/")
        self.run_id = run_id
        self.url = f"{self.base}/{run_id}" if run_id else self.base
        self.keep_last = keep_last
        self.resume_from = resume_from
        self.must_resume = must_resume
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")

    @classmethod
    def for_run(cls, runtime: Any) -> CheckpointStore:
        """The store of a run (``runtime``: a :class:`rpeg.config.RuntimeConfig`), its run id
        resolved by :func:`resolve_run_id`."""
        return cls(
            runtime.checkpoint_url,
            runtime.keep_last,
            run_id=resolve_run_id(runtime),
            resume_from=runtime.resume_from,
            must_resume=bool(runtime.resume or runtime.resume_from),
        )

    # ---------------------------------------------------------------- paths
    def _dir(self, step: int) -> str:
        return step_url(self.root, step)

    def step_url(self, step: int) -> str:
        return step_url(self.url, step)

    def _steps(self) -> list[int]:
        return list_steps(self.fs, self.root)

    # ---------------------------------------------------------------- write
    def save(
        self,
        step: int,
        parts: dict[str, bytes],
        meta: dict[str, Any] | None = None,
        before_commit: Any = None,
    ) -> CheckpointInfo:
        """Write ``parts`` (name -> bytes) then the commit marker; prune old checkpoints.
        ``before_commit(step_url) -> dict``: called once the parts are written, before the
        marker (the ranks write their shards into the step's folder then); its dict joins
        the marker. A storage failure removes the partial directory and raises
        :class:`CheckpointWriteError`."""
        t0 = time.perf_counter()
        d = self._dir(step)
        for name in parts:
            if "/" in name or name == COMMIT:
                raise CheckpointError(f"bad part name {name!r}")
        files = {}
        try:
            if self.fs.exists(d):
                self.fs.rm(d, recursive=True)
            self.fs.makedirs(d, exist_ok=True)
            for name, data in parts.items():
                with self.fs.open(f"{d}/{name}", "wb") as fh:
                    fh.write(data)
                files[name] = {"sha256": sha256_hex(data), "bytes": len(data)}
            if before_commit is not None:
                meta = {**(meta or {}), **before_commit(self.step_url(step))}
            commit = {
                **(meta or {}),
                "format": FORMAT_VERSION,
                "run_id": self.run_id,
                "step": step,
                "created_unix_s": time.time(),
                "files": files,
            }
            with self.fs.open(f"{d}/{COMMIT}", "wb") as fh:
                fh.write(json.dumps(commit, indent=1, sort_keys=True).encode())
        except OSError as exc:
            self._remove_partial(d)
            reason = _write_reason(exc)
            raise CheckpointWriteError(
                f"checkpoint step {step} not written to {self.step_url(step)}: "
                f"{_REASON_TEXT[reason]}: {type(exc).__name__}: {exc}; the partial "
                "checkpoint was removed",
                reason,
            ) from exc
        self.prune()
        commit["write_s"] = time.perf_counter() - t0
        commit["total_bytes"] = sum(f["bytes"] for f in files.values())
        return CheckpointInfo(step, d, commit)

    def _remove_partial(self, d: str) -> None:
        try:
            if self.fs.exists(d):
                self.fs.rm(d, recursive=True)
        except Exception as exc:  # noqa: BLE001 - reported, the write error is what matters
            log.warning("could not remove partial checkpoint %s: %s", d, exc)

    def prune(self) -> None:
        complete = self.complete_steps()
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
        return verify_checkpoint(self.fs, self._dir(step), self.run_id)

    def complete_steps(self) -> list[int]:
        return [s for s in self._steps() if self.fs.exists(f"{self._dir(s)}/{COMMIT}")]

    def latest(self) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """The newest complete, verified checkpoint of this run (warning on each corrupt one
        skipped); before this run has one, the one ``resume_from`` names. None if there is
        none, unless the store must resume: then a :class:`CheckpointError` listing what
        was found."""
        got = newest_verified(self.fs, self.root, self.run_id)
        if got is None and self.resume_from:
            got = find_checkpoint(self.resume_from)
        if got is None and self.must_resume:
            where = self.resume_from or self.url
            raise CheckpointError(
                f"nothing usable to resume from at {where}; found: "
                + "; ".join(survey(where) or ["nothing"])
            )
        return got
