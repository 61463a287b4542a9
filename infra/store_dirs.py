"""The LocalCluster's store folders (``<tmp>/rpeg-cluster-*``): made with their owner recorded,
and those of a dead owner removed when the next cluster starts (issue 44: a driver killed
with ``kill -9`` cannot run ``close()``, so its folder stayed behind, one per killed run).

A folder holds ``owner.json`` (``pid`` and the process's start time from ``/proc``, so a
reused pid is not taken for the owner). :func:`sweep_stale` removes a folder of this user
whose owner is gone, and a folder without an owner file (an older rpeg's) untouched for
:data:`UNOWNED_AFTER_S`. Folders of live owners, and of other users, are left alone.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
import time

PREFIX = "rpeg-cluster-"
OWNER = "owner.json"
#: a store folder without an owner file is removed once untouched this long (seconds)
UNOWNED_AFTER_S = 24 * 3600.0


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of ``/proc/PID/stat``), None if gone or
    unknown."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    if os.path.isdir("/proc"):
        now = _start_time(pid)
        return now is not None and (started is None or now == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_store_dir() -> str:
    """A fresh ``rpeg-cluster-*`` folder (mode 0700) with this process as its owner."""
    path = tempfile.mkdtemp(prefix=PREFIX)
    with open(os.path.join(path, OWNER), "w") as fh:
        json.dump({"pid": os.getpid(), "started": _start_time(os.getpid())}, fh)
    return path


def sweep_stale(root: str | None = None, now: float | None = None) -> list[str]:
    """Remove the store folders of dead owners under ``root`` (the temporary folder);
    returns those removed."""
    root = root or tempfile.gettempdir()
    now = time.time() if now is None else now
    removed = []
    for path in glob.glob(os.path.join(root, PREFIX + "*")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
            continue
        try:
            with open(os.path.join(path, OWNER)) as fh:
                owner = json.load(fh)
            stale = not _alive(int(owner["pid"]), owner.get("started"))
        except (OSError, ValueError, KeyError, TypeError):
            stale = now - st.st_mtime > UNOWNED_AFTER_S
        if stale:
            with contextlib.suppress(OSError):
                shutil.rmtree(path)
                removed.append(path)
    return removed
