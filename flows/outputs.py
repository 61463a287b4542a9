"""Per-run output folders: ``<base>/<run name>/`` plus a ``<base>/latest`` pointer.

Every deployed run (flows ``train`` and ``retrain``) writes its metrics, timeline and
pictures to a folder named after its flow run, so an older run's artifacts keep pointing at
its own files. ``<base>/latest`` is a relative symlink to the newest run's folder, for code
and people that read ``runs/latest`` (the config default). The base folder is the output-dir
parameter, else the config's ``runtime.output_dir`` (its parent when that is ``.../latest``).
No prefect here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("rpeg.flows.outputs")
LATEST = "latest"


def safe_name(name: str) -> str:
    """A folder name from a run name: letters, digits, ``._-``."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return s or "run"


def base_folder(config_output_dir: str, param_output_dir: str = "") -> Path:
    """Where run folders go: the parameter, else the config's output dir (its parent when
    it is a ``latest`` folder, as the default ``runs/latest`` is)."""
    if param_output_dir:
        return Path(param_output_dir)
    p = Path(config_output_dir)
    return p.parent if p.name == LATEST else p


def run_folder(base: str | Path, run_name: str) -> Path:
    """``<base>/<run name>`` (created)."""
    d = Path(base) / safe_name(run_name)
    d.mkdir(parents=True, exist_ok=True)
    return d


def point_latest(run_dir: str | Path) -> Path | None:
    """Make ``<base>/latest`` a relative symlink to ``run_dir`` (atomic replace). An existing
    real ``latest`` folder (written by ``rpeg train``) is left alone. Returns the link."""
    run_dir = Path(run_dir)
    link = run_dir.parent / LATEST
    if link.exists() and not link.is_symlink():
        log.info("%s is a real folder; not replacing it with a link", link)
        return None
    tmp = run_dir.parent / f".{LATEST}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as exc:  # a file system without symlinks: the folders still work
        log.info("could not point %s at %s: %s", link, run_dir, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return link


__all__ = ["LATEST", "base_folder", "point_latest", "run_folder", "safe_name"]
