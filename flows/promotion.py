"""Where retraining keeps its state: the newest data file, the latest complete checkpoint,
the ``latest-good`` pointer and its copy, and the promotion rule. No prefect here.

* :func:`newest_file` -- the newest file under an fsspec glob (by mtime or by name).
* :func:`latest_step` -- the newest complete checkpoint's step under a checkpoint URL.
* :func:`should_promote` -- promote unless the score regressed below previous - tolerance.
* :func:`write_latest_good` -- ``<url>/latest-good.json`` written atomically (temp + move),
  after copying the promoted checkpoint to ``<url>/latest-good/`` so pruning never removes it.
"""

import json
from datetime import datetime
from typing import Any

LATEST_GOOD = "latest-good.json"
LATEST_GOOD_DIR = "latest-good"
SCORE_KEY = "heldout_acc_after"


def fs_of(url: str):
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def newest_file(glob: str, newest_by: str = "mtime") -> str | None:
    """The newest file matching the fsspec ``glob`` as a URL (same protocol), or None."""
    fs, _ = fs_of(glob)
    paths = [p for p in fs.glob(glob) if fs.isfile(p)]
    if not paths:
        return None

    def mtime(p: str) -> float:
        info = fs.info(p)
        for k in ("mtime", "LastModified", "last_modified", "updated", "created"):
            v = info.get(k)
            if v is None:
                continue
            if isinstance(v, datetime):
                return v.timestamp()
            if isinstance(v, str):
                try:
                    return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
            return float(v)
        return 0.0

    best = max(paths, key=(lambda p: (mtime(p), p)) if newest_by == "mtime" else (lambda p: p))
    proto = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    return best if proto in ("file", "local") else fs.unstrip_protocol(best)


def latest_step(checkpoint_url: str) -> int:
    """Step of the newest complete checkpoint under ``checkpoint_url`` (0 if none)."""
    from rpeg.runtime.actors.checkpoint import CheckpointStore

    steps = CheckpointStore(checkpoint_url).complete_steps()
    return max(steps, default=0)


def read_latest_good(checkpoint_url: str) -> dict[str, Any] | None:
    """The ``latest-good.json`` pointer next to the checkpoints, or None."""
    fs, root = fs_of(checkpoint_url)
    try:
        with fs.open(f"{root}/{LATEST_GOOD}", "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return None


def should_promote(
    score: float, previous: dict[str, Any] | None, tolerance: float = 0.0
) -> tuple[bool, str]:
    """(promote?, reason): promote unless the score regressed below previous - tolerance."""
    if score != score:  # NaN: no evaluation happened
        return False, "no held-out score (empty held-out set)"
    if previous is None or previous.get("score") is None:
        return True, "no previous latest-good checkpoint"
    prev = float(previous["score"])
    if score >= prev - tolerance:
        return True, f"score {score:.4f} >= previous {prev:.4f} - tolerance {tolerance:g}"
    return False, f"score {score:.4f} < previous {prev:.4f} - tolerance {tolerance:g} (regressed)"


def write_latest_good(
    checkpoint_url: str,
    record: dict[str, Any],
    *,
    copy_step: int | None = None,
    steps_url: str | None = None,
) -> dict[str, Any]:
    """Write the pointer atomically (temp file + move); optionally copy checkpoint
    ``copy_step`` (under ``steps_url``, default ``checkpoint_url``: a run's folder when
    checkpoints carry a run id) to ``<checkpoint_url>/latest-good/`` first. Returns the
    record written."""
    fs, root = fs_of(checkpoint_url)
    record = dict(record)
    if copy_step is not None:
        _, steps_root = fs_of(steps_url or checkpoint_url)
        src = f"{steps_root}/step-{copy_step:08d}"
        dst = f"{root}/{LATEST_GOOD_DIR}"
        tmp = f"{dst}.tmp"
        for d in (tmp,):
            if fs.exists(d):
                fs.rm(d, recursive=True)
        fs.copy(src, tmp, recursive=True)
        if fs.exists(dst):
            fs.rm(dst, recursive=True)
        fs.mv(tmp, dst, recursive=True)
        record["copy"] = url_of(fs, dst)
    data = json.dumps(record, indent=1, sort_keys=True).encode()
    tmp = f"{root}/.{LATEST_GOOD}.tmp"
    with fs.open(tmp, "wb") as fh:
        fh.write(data)
    fs.mv(tmp, f"{root}/{LATEST_GOOD}")
    return record


def url_of(fs: Any, path: str) -> str:
    proto = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    return path if proto in ("file", "local") else fs.unstrip_protocol(path)


def checkpoint_location(checkpoint_url: str, step: int) -> str:
    """The URL (or path) of checkpoint ``step`` under ``checkpoint_url``."""
    fs, root = fs_of(checkpoint_url)
    return url_of(fs, f"{root}/step-{step:08d}")


__all__ = [
    "LATEST_GOOD",
    "LATEST_GOOD_DIR",
    "SCORE_KEY",
    "checkpoint_location",
    "fs_of",
    "latest_step",
    "newest_file",
    "read_latest_good",
    "should_promote",
    "url_of",
    "write_latest_good",
]
