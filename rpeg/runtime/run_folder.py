"""Each run in a folder of its own, owned by one writer at a time.

* **Run folders.** ``rpeg train`` (both runtimes) and a deployed ``train`` run write under
  ``<base>/<run id>/`` where ``<base>`` is ``runtime.output_dir`` (its parent when that is a
  ``latest`` folder, as the default ``runs/latest`` is); the folder holds the resolved
  ``config.yaml`` (what ``rpeg eval``, ``rpeg calibrate`` and ``rpeg export`` read when given
  the folder alone), ``metrics.jsonl``, ``samples.jsonl``, TensorBoard's ``tb/`` and the
  pictures. ``<base>/latest`` is a relative symbolic link to the newest run's folder.
* **Locks.** A run holds ``<run folder>/.rpeg-run.lock`` and, for a local checkpoint URL,
  ``<checkpoint_url>/<run id>/.rpeg-run.lock`` while it runs: a JSON file with the owner's
  host, pid, run id and start time, created with ``O_CREAT | O_EXCL`` (one creator wins). A
  second writer is refused before anything starts (:class:`RunLocked`, exit 2), naming the
  owner. A lock whose owner is a dead process on this host (a run killed with ``kill -9``) is
  stale: it is moved aside (a rename, which only one taker wins) and taken over.
* **Whole lines.** :func:`append_lines` writes lines with one ``write`` on a descriptor opened
  with ``O_APPEND``: the kernel places each write at the end of the file as a unit, so two
  writers interleave whole lines, never parts of them (a buffered ``open(..., "a")`` flushes
  in 8 KiB pieces, which tore a line of ``metrics.jsonl`` in two).

No torch, dask or prefect here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rpeg.errors import RpegError

LATEST = "latest"
LOCK_FILE = ".rpeg-run.lock"
CONFIG_FILE = "config.yaml"


class RunLocked(RpegError):
    """Another process owns the run folder or checkpoint location (exit 2, like a refusal)."""

    exit_code = 2


# ------------------------------------------------------------------------- whole lines
def append_lines(path: str | Path, lines: Iterable[str]) -> int:
    """Append ``lines`` (each without its newline) to ``path`` with one ``O_APPEND`` write:
    whole lines, even with several writers. Returns the bytes written."""
    data = "".join(f"{line}\n" for line in lines).encode()
    if not data:
        return 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it in one write; a short write goes on
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)
    return len(data)


def rewrite_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Replace ``path`` with ``lines`` at once (a temporary file renamed over it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)


# ------------------------------------------------------------------------- run folders
def base_folder(output_dir: str | Path) -> Path:
    """Where run folders go: ``output_dir``, or its parent when it is a ``latest`` folder."""
    p = Path(output_dir)
    return p.parent if p.name == LATEST else p


def is_run_folder(output_dir: str | Path, run_id: str | None) -> bool:
    """Whether ``output_dir`` already is the folder of run ``run_id`` (a prepared config)."""
    return bool(run_id) and Path(output_dir).name == run_id


def run_folder(output_dir: str | Path, run_id: str) -> Path:
    """``<base>/<run id>`` (not created)."""
    return base_folder(output_dir) / run_id


def point_latest(folder: str | Path) -> Path | None:
    """``<base>/latest`` -> ``folder`` (a relative symbolic link, replaced atomically). A real
    ``latest`` folder (written before run folders existed) is renamed
    ``latest.before-<date>`` first: kept, not deleted. None where links are not possible."""
    folder = Path(folder)
    link = folder.parent / LATEST
    if link.is_dir() and not link.is_symlink():
        kept = link.with_name(f"{LATEST}.before-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            link.rename(kept)
        except OSError:
            return None
    tmp = folder.parent / f".{LATEST}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(folder.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError:  # a file system without symbolic links: the run folders still work
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return link


def write_config(folder: str | Path, config: Any) -> Path:
    """The run's resolved config as ``<folder>/config.yaml`` (every field, defaults
    included; ``resume`` off: ``rpeg train <folder>/config.yaml --resume`` continues it)."""
    import yaml

    d = config.model_dump(mode="json")
    d["runtime"]["resume"] = False
    d["runtime"]["resume_from"] = None
    path = Path(folder) / CONFIG_FILE
    tmp = path.with_name(f".{CONFIG_FILE}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(d, sort_keys=False))
    os.replace(tmp, path)
    return path


def config_in(folder: str | Path) -> Path | None:
    """``<folder>/config.yaml`` when ``folder`` is a run folder (or ``latest``), else None."""
    p = Path(folder) / CONFIG_FILE
    return p if p.is_file() else None


def checkpoints_of(folder: str | Path) -> str | None:
    """Where the run of a run folder checkpoints: ``<checkpoint_url>/<run id>`` read from
    its ``config.yaml`` (None: no config.yaml, or the run kept no checkpoints). For commands
    that take the run folder alone (``rpeg export``, ``rpeg eval``)."""
    import yaml

    path = config_in(folder)
    if path is None:
        return None
    try:
        rt = (yaml.safe_load(path.read_text()) or {}).get("runtime") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    url, rid = rt.get("checkpoint_url"), rt.get("run_id")
    if not url or not rid:
        return None
    return f"{str(url).rstrip('/')}/{rid}"


# ------------------------------------------------------------------------------- locks
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def owner_line(owner: dict[str, Any]) -> str:
    started = owner.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, int | float)
        else "?"
    )
    return (
        f"run {owner.get('run_id', '?')} (pid {owner.get('pid', '?')} on host "
        f"{owner.get('host', '?')}, started {when})"
    )


def _stale(owner: dict[str, Any]) -> bool:
    """The owner is a process of this host that no longer runs (or this very process)."""
    if owner.get("host") != socket.gethostname():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    return pid == os.getpid() or not _alive(pid)


class RunLock:
    """An exclusive lock file (see the module doc). :meth:`acquire` raises :class:`RunLocked`
    naming the owner; :meth:`release` removes the file if it is still ours."""

    def __init__(self, path: str | Path, run_id: str, what: str):
        self.path = Path(path)
        self.run_id = run_id
        self.what = what  # "run folder" / "checkpoint location", for the message
        self.field = "runtime.checkpoint_url" if "checkpoint" in what else "runtime.output_dir"
        self.took_over: dict[str, Any] | None = None
        self._mine: dict[str, Any] | None = None

    def acquire(self, *, wait_for_partial_s: float = 1.0) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": self.run_id,
            "started": time.time(),
        }
        deadline = time.monotonic() + wait_for_partial_s
        for _ in range(100):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = _read_owner(self.path)
                if owner is None:  # being written right now, or damaged
                    if time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    raise RunLocked(
                        f"the {self.what} {self.path.parent} is locked by {self.path}, which "
                        "names no owner; if no run uses it, remove that file"
                    ) from None
                if not _stale(owner):
                    raise RunLocked(
                        f"the {self.what} {self.path.parent} is in use by {owner_line(owner)}; "
                        f"a second writer would corrupt its files. Wait for that run, stop it, "
                        f"or choose another runtime.run_id or {self.field} (lock file "
                        f"{self.path})"
                    ) from None
                aside = self.path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
                try:  # one taker wins the rename; the others find the new lock next round
                    os.rename(self.path, aside)
                except FileNotFoundError:
                    continue
                with contextlib.suppress(OSError):
                    aside.unlink()
                self.took_over = owner
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(me))
            self._mine = me
            return self
        raise RunLocked(f"could not take the lock {self.path}: it changed owner 100 times")

    def release(self) -> None:
        if self._mine is None:
            return
        owner = _read_owner(self.path)
        if owner is not None and owner.get("pid") == self._mine["pid"]:
            with contextlib.suppress(OSError):
                self.path.unlink()
        self._mine = None


def local_checkpoint_dir(checkpoint_url: str | None, run_id: str) -> Path | None:
    """``<checkpoint_url>/<run id>`` when the URL is a local path (or ``file://``); None for
    object stores (no atomic create there: only the run folder is locked)."""
    if not checkpoint_url:
        return None
    url = checkpoint_url
    if url.startswith("file://"):
        url = url[len("file://") :]
    elif "://" in url:
        return None
    return Path(url.rstrip("/") or "/") / run_id


class RunLease:
    """The locks a run holds (its folder, its local checkpoint location); :meth:`release`
    when the run ends, however it ends."""

    def __init__(self, locks: list[RunLock]):
        self.locks = locks

    @property
    def took_over(self) -> list[dict[str, Any]]:
        return [lk.took_over for lk in self.locks if lk.took_over]

    def release(self) -> None:
        for lk in reversed(self.locks):
            lk.release()

    def __enter__(self) -> RunLease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_run(folder: str | Path | None, checkpoint_url: str | None, run_id: str) -> RunLease:
    """Lock the run folder (when given) and the local checkpoint location of ``run_id``;
    :class:`RunLocked` (and nothing held) when either has another live owner."""
    places = []
    if folder is not None:
        places.append((Path(folder) / LOCK_FILE, "run folder"))
    ck = local_checkpoint_dir(checkpoint_url, run_id)
    if ck is not None:
        places.append((ck / LOCK_FILE, "checkpoint location"))
    held: list[RunLock] = []
    try:
        for path, what in places:
            held.append(RunLock(path, run_id, what).acquire())
    except BaseException:
        for lk in reversed(held):
            lk.release()
        raise
    return RunLease(held)


__all__ = [
    "CONFIG_FILE",
    "LATEST",
    "LOCK_FILE",
    "RunLease",
    "RunLock",
    "RunLocked",
    "append_lines",
    "base_folder",
    "checkpoints_of",
    "config_in",
    "is_run_folder",
    "local_checkpoint_dir",
    "lock_run",
    "owner_line",
    "point_latest",
    "rewrite_lines",
    "run_folder",
    "write_config",
]
