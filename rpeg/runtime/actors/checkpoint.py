"""Atomic checkpoints on any fsspec URL (local path, memory://, s3://, gs://).

Layout under the run's checkpoint URL (``runtime.checkpoint_url``)::

    <url>/<run_id>/step-00000010/<name>.pt     one state file per part (rank states, buffer,
                                               driver state): safetensors + a JSON tree
                                               (:mod:`rpeg.runtime.actors.state_file`)
    <url>/<run_id>/step-00000010/COMMIT.json   written last: format, run id, step, policy
                                               version, the sha256 and size of every part

Every run writes under its own run id (``runtime.run_id``; a fresh run gets a new one), so
runs sharing a checkpoint URL never prune or resume each other's checkpoints.
``--resume`` continues the one run found at the URL (or the run named by ``run_id``);
``--resume-from URL`` starts from a checkpoint of any run (a step folder, a run folder or a
checkpoint URL) and then writes under this run's id. A ``--resume`` that finds nothing
usable is an error listing what was found.

A directory without ``COMMIT.json`` is partial (the writer died) and is ignored; a failed
write removes its own partial directory and raises :class:`CheckpointWriteError` (disk full,
permission denied, ...), which the flow reports as such, never as a lost worker. A part
whose checksum does not match its commit marker makes the checkpoint corrupt: ``latest()``
warns and falls back to the previous complete one. ``keep_last`` complete checkpoints of
this run are kept; its older ones (and its partial ones older than the newest commit) are
deleted. Format-1 checkpoints (``torch.save`` pickles) are refused: loading them could run
code.

A store built without a run id (``CheckpointStore(url)``) keeps the flat layout
``<url>/step-N`` (used by single-folder tools such as the retrain flow's local engine).
"""

from __future__ import annotations

import errno
import hashlib
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
from rpeg.runtime.actors.checkpoint_identity import mismatches
from rpeg.runtime.actors.state_file import StateFileError
from rpeg.runtime.actors.state_file import dumps as _state_dumps
from rpeg.runtime.actors.state_file import loads as _state_loads

log = logging.getLogger(__name__)

COMMIT = "COMMIT.json"
_STEP_RE = re.compile(r"step-(\d{8})$")


def step_folder(step: int) -> str:
    """The folder name of the checkpoint after ``step`` steps (``step-00000010``): the one
    place it is spelled."""
    return f"step-{step:08d}"


def step_url(root: str, step: int) -> str:
    """``<root>/step-NNNNNNNN`` (``root``: a checkpoint URL or path, run folder included)."""
    return f"{root.rstrip('/')}/{step_folder(step)}"


_RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FORMAT_VERSION = 2  # 1: torch.save pickles (refused); 2: rpeg state files + run id


class CheckpointError(RpegError):
    """No usable checkpoint, or one that cannot be written."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed for a reason of the storage (``reason``: ``disk_full``,
    ``permission``, ``io``); the partial directory was removed. Not a lost worker."""

    def __init__(self, message: str, reason: str = "io"):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        return (type(self), (str(self), self.reason))


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str
    meta: dict[str, Any]


def _sha256(data: bytes) -> str:
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
        keep_last: int = 3,
        *,
        run_id: str | None = None,
        resume_from: str | None = None,
        must_resume: bool = False,
    ):
        if run_id is not None and not _RUN_RE.match(run_id):
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
        return _list_steps(self.fs, self.root)

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
                files[name] = {"sha256": _sha256(data), "bytes": len(data)}
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
        return _verify(self.fs, self._dir(step), self.run_id)

    def complete_steps(self) -> list[int]:
        return [s for s in self._steps() if self.fs.exists(f"{self._dir(s)}/{COMMIT}")]

    def latest(self) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """The newest complete, verified checkpoint of this run (warning on each corrupt one
        skipped); before this run has one, the one ``resume_from`` names. None if there is
        none, unless the store must resume: then a :class:`CheckpointError` listing what
        was found."""
        got = _newest_verified(self.fs, self.root, self.run_id)
        if got is None and self.resume_from:
            got = find_checkpoint(self.resume_from)
        if got is None and self.must_resume:
            where = self.resume_from or self.url
            raise CheckpointError(
                f"nothing usable to resume from at {where}; found: "
                + "; ".join(survey(where) or ["nothing"])
            )
        return got


# ------------------------------------------------------------------------------ helpers
def _ls(fs: Any, root: str, detail: bool) -> list[Any]:
    """``fs.ls(root)``; nothing where ``root`` is missing or no folder."""
    try:
        return fs.ls(root, detail=detail)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _list_steps(fs: Any, root: str) -> list[int]:
    out = []
    for e in _ls(fs, root, detail=False):
        m = _STEP_RE.search(str(e).rstrip("/"))
        if m:
            out.append(int(m.group(1)))
    return sorted(set(out))


def _verify(fs: Any, d: str, run_id: str | None) -> tuple[dict[str, Any], dict[str, bytes]]:
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
        if len(data) != info["bytes"] or _sha256(data) != info["sha256"]:
            raise CheckpointError(f"{d}/{name}: checksum mismatch (corrupt checkpoint)")
        parts[name] = data
    return meta, parts


def _newest_verified(
    fs: Any, root: str, run_id: str | None
) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    for step in reversed(_list_steps(fs, root)):
        try:
            return _verify(fs, step_url(root, step), run_id)
        except CheckpointError as exc:
            msg = f"skipping checkpoint step {step}: {exc}; trying the previous one"
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            log.warning(msg)
    return None


def _runs(fs: Any, root: str) -> list[str]:
    """Run folders under a checkpoint URL (folders holding ``step-*`` folders)."""
    out = []
    for e in _ls(fs, root, detail=True):
        name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
        is_run = e.get("type") == "directory" and _RUN_RE.match(name)
        if is_run and not _STEP_RE.search(name) and _list_steps(fs, f"{root}/{name}"):
            out.append(name)
    return sorted(out)


def _state(fs: Any, d: str) -> str:
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


def survey(url: str) -> list[str]:
    """What a checkpoint URL holds, one line per run (or flat folder): its steps and their
    state (complete / partial / corrupt / refused format)."""
    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    root = root.rstrip("/")
    lines = []
    places = [("(flat)", root)] + [(r, f"{root}/{r}") for r in _runs(fs, root)]
    for label, where in places:
        steps = _list_steps(fs, where)
        if not steps:
            continue
        desc = ", ".join(f"step {s} {_state(fs, step_url(where, s))}" for s in steps)
        lines.append(f"{label}: {desc}")
    if not lines and _STEP_RE.search(root):
        lines.append(f"{root}: {_state(fs, root)}")
    return lines


def find_checkpoint(url: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The newest verified checkpoint at ``url``: a step folder, a run folder, or a
    checkpoint URL holding exactly one run (any run id)."""
    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    root = root.rstrip("/")
    if _STEP_RE.search(root):
        try:
            return _verify(fs, root, None)
        except CheckpointError as exc:
            warnings.warn(f"--resume-from {url}: {exc}", RuntimeWarning, stacklevel=2)
            return None
    got = _newest_verified(fs, root, None)
    if got is not None:
        return got
    runs = _runs(fs, root)
    if len(runs) > 1:
        raise CheckpointError(
            f"{url} holds checkpoints of {len(runs)} runs ({', '.join(runs)}); name one: "
            f"{url.rstrip('/')}/<run_id>"
        )
    return _newest_verified(fs, f"{root}/{runs[0]}", None) if runs else None


def resolve_run_id(runtime: Any) -> str:
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
    return any(_state(fs, step_url(root, s)) == "complete" for s in _list_steps(fs, root))


def _newest_complete_meta(fs: Any, root: str) -> dict[str, Any] | None:
    """The commit marker of the newest complete step under ``root`` (a run's folder or one
    step's), None if there is none."""
    steps = [root] if _STEP_RE.search(root) else [step_url(root, s) for s in _list_steps(fs, root)]
    for d in reversed(steps):
        if _state(fs, d) == "complete":
            with fs.open(f"{d}/{COMMIT}", "rb") as fh:
                return json.loads(fh.read())
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
            _state(fs, root) == "complete"
            if _STEP_RE.search(root)
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


# --------------------------------------------------------------------------- one rank's state
def rank_state_bytes(rank: int, group: str, roles: dict[str, Any], light: bool = False) -> bytes:
    """One rank's state file (:func:`dumps`: safetensors + JSON, no pickle): each present role's
    ``state_dict`` (``roles``: actor / reference / critic, None when absent), the actor's
    engine version, and a lagging engine copy's full weights."""
    st: dict[str, Any] = {"rank": rank, "group": group}
    for name, wk in roles.items():
        if wk is not None:
            # light: no weights or optimizer state (a sharded group writes those itself:
            # RankActor.save_shards), RNG states and versions only
            st[name] = wk.state_dict(weights=False) if light else wk.state_dict()
    actor = roles.get("actor")
    if actor is not None and not light:
        st["engine_version"] = int(actor.engine.policy_version)
        if getattr(actor.engine, "model", actor.lm) is not actor.lm:
            from rpeg.runtime.sharding import full_state_dict

            st["engine_weights"] = full_state_dict(actor.engine.model)
    return dumps(st)


def load_rank_state_bytes(data: bytes, roles: dict[str, Any]) -> None:
    """Load :func:`rank_state_bytes` into ``roles``; the engine gets its saved weights (a
    lagging copy) or the actor's (vLLM: its weights are not in checkpoints)."""
    st = loads(data)
    for name, wk in roles.items():
        if wk is not None and name in st:
            wk.load_state_dict(st[name])
    actor = roles.get("actor")
    if actor is None:
        return
    eng = actor.engine
    if "engine_weights" in st and getattr(eng, "model", None) is not actor.lm:
        eng.update_weights(st["engine_weights"], st["engine_version"])
    if hasattr(eng, "model"):
        eng.policy_version = st.get("engine_version", actor.policy_version)
    else:  # vLLM: it restarts from the actor's weights
        eng.update_weights(actor.get_weights(), actor.policy_version)
