"""Where a run writes, checked before anything starts (called by the preflight).

* ``runtime.checkpoint_url`` must outlive the run: ``memory://`` (fsspec's in-process store)
  accepted checkpoints and lost them all at exit, so it is refused, naming the schemes that
  persist.
* ``runtime.output_dir`` must not hold a symbolic link to a file, or a dangling one: the run
  writes files there (``metrics.jsonl``, ``samples.jsonl``, ``reward_curve.png``,
  ``timeline.json``, ...) with plain ``open``, which follows a link planted under one of those
  names and overwrites its target (or creates it). A link to a folder is left alone (a
  checkpoint folder on another disk is a common, deliberate layout).
"""

from __future__ import annotations

import os
from typing import Any

from rpeg.errors import Problem

#: fsspec schemes whose data does not outlive the process that wrote it
TRANSIENT_SCHEMES = ("memory",)
#: named in the refusal (any fsspec store that persists works; these are the common ones)
PERSISTENT_EXAMPLES = (
    "a local path, file://, s3://, gs://, gcs://, abfs://, az://, hdfs://, sftp://"
)


def checkpoint_url_problems(url: str | None) -> list[Problem]:
    if not url or "://" not in url:
        return []
    scheme = url.split("://", 1)[0].lower()
    if scheme in TRANSIENT_SCHEMES:
        return [
            Problem(
                "runtime.checkpoint_url",
                f"{url!r}: {scheme}:// keeps data in this process's memory; every checkpoint "
                f"would be lost when the run ends. Allowed: {PERSISTENT_EXAMPLES} (any "
                "fsspec store that persists)",
            )
        ]
    return []


def planted_link_problems(output_dir: str) -> list[Problem]:
    """Symbolic links in ``output_dir`` that a run's file writes would follow."""
    try:
        entries = list(os.scandir(output_dir))
    except OSError:  # missing (created by the run) or unreadable (the writable check says so)
        return []
    out = []
    for e in sorted(entries, key=lambda e: e.name):
        if not e.is_symlink() or os.path.isdir(e.path):
            continue
        target = os.readlink(e.path)
        what = "a file" if os.path.exists(e.path) else "nothing (a dangling link)"
        out.append(
            Problem(
                "runtime.output_dir",
                f"{e.path!r} is a symbolic link to {target!r} ({what}); the run writes its "
                "files in this folder and would write through it. Remove the link or choose "
                "another runtime.output_dir",
            )
        )
    return out


def run_place_problems(config: Any) -> list[Problem]:
    """Both checks for a :class:`rpeg.config.RunConfig`."""
    rt = config.runtime
    return checkpoint_url_problems(rt.checkpoint_url) + planted_link_problems(rt.output_dir)
