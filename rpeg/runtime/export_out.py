"""Where ``rpeg export`` writes: never over or beside files it did not write (issue 44).

transformers' ``save_pretrained`` deletes the weight files of the folder it writes into that it
did not write this time (``model-00001-of-00002.safetensors`` of a user's model), and overwrites
its ``config.json``. So an export is written into a fresh staging folder first and then moved
into ``--out`` under these rules:

* ``--out`` missing or empty: written, with a manifest :data:`MANIFEST` listing every file
  written and its size.
* ``--out`` not empty: refused before the checkpoint is read (a :class:`ConfigError` naming
  the folder and a few of its files), unless ``force``.
* ``force``: ``--out`` must hold a previous export's manifest; only the files it lists are
  replaced or removed (a listed file whose size changed since is refused, naming it), and a
  new file that would replace one the manifest does not list is refused before anything
  moves. Every other file stays as it was.

A local ``--out`` is staged beside it (same file system: each file is renamed into place); a
remote URL (fsspec) is staged in the system's temporary folder and uploaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from rpeg.errors import ConfigError, Problem

#: the manifest an export writes into its folder: ``{"files": {relative path: size}}``
MANIFEST = "rpeg-export.json"
_SHOWN = 5  # files named in a refusal


def _fs(out: str) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(out)
    return fs, root.rstrip("/") or "/"


def _listing(fs: Any, root: str, out: str) -> dict[str, int]:
    """Relative path -> size of every file under ``root`` ({} when it does not exist)."""
    if not fs.exists(root):
        return {}
    if not fs.isdir(root):
        raise ConfigError([Problem("--out", f"{out} is a file; expected a folder")])
    found = fs.find(root, detail=True)
    prefix = root.rstrip("/") + "/"
    return {
        p[len(prefix) :] if p.startswith(prefix) else p: int(info.get("size") or 0)
        for p, info in found.items()
    }


def _names(rels: list[str]) -> str:
    more = f", ... ({len(rels)} in all)" if len(rels) > _SHOWN else ""
    return ", ".join(sorted(rels)[:_SHOWN]) + more


def _previous(fs: Any, root: str, out: str, existing: dict[str, int]) -> dict[str, int]:
    """The files of the previous export in ``out`` (its manifest), checked unchanged."""
    others = sorted(r for r in existing if r != MANIFEST)
    if MANIFEST not in existing:
        raise ConfigError(
            [
                Problem(
                    "--out",
                    f"{out} holds {len(others)} files no rpeg export wrote ({_names(others)}; "
                    f"no {MANIFEST}): --force replaces only a previous export's files; "
                    "export into an empty or new folder",
                )
            ]
        )
    try:
        with fs.open(f"{root}/{MANIFEST}", "r") as fh:
            files = json.load(fh)["files"]
        files = {str(k): int(v) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            [Problem("--out", f"{out}/{MANIFEST} is not an export manifest ({exc})")]
        ) from None
    changed = [r for r, size in files.items() if r in existing and existing[r] != size]
    if changed:
        raise ConfigError(
            [
                Problem(
                    "--out",
                    f"{out}: {_names(changed)} changed since rpeg export wrote them (another "
                    "size); --force replaces only files as the previous export left them",
                )
            ]
        )
    return files


def check_out(out: str, force: bool) -> dict[str, int]:
    """Refuse ``out`` as an export's folder before anything is read (see the module); returns
    the previous export's files that may be replaced ({} for an empty or new folder)."""
    fs, root = _fs(out)
    existing = _listing(fs, root, out)
    if not existing:
        return {}
    if not force:
        raise ConfigError(
            [
                Problem(
                    "--out",
                    f"{out} is not empty ({_names(sorted(existing))}); rpeg export writes into "
                    "an empty or new folder, or with --force over the files a previous export "
                    f"wrote there (listed in its {MANIFEST}); no other file is replaced or "
                    "deleted",
                )
            ]
        )
    return _previous(fs, root, out, existing)


@contextlib.contextmanager
def staged_export(out: str, force: bool) -> Iterator[str]:
    """Check ``out`` (:func:`check_out`), yield a fresh local folder to write the export into,
    then move its files into ``out`` by the rules above and write the manifest."""
    previous = check_out(out, force)
    fs, root = _fs(out)
    local = _is_local(fs)
    parent = os.path.dirname(os.path.abspath(root)) if local else None
    if parent:
        os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".rpeg-export-", dir=parent)
    try:
        yield stage
        _publish(stage, fs, root, out, previous, local)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _publish(
    stage: str, fs: Any, root: str, out: str, previous: dict[str, int], local: bool
) -> None:
    written = {
        os.path.relpath(os.path.join(d, f), stage).replace(os.sep, "/"): os.path.getsize(
            os.path.join(d, f)
        )
        for d, _, files in os.walk(stage)
        for f in files
    }
    written.pop(MANIFEST, None)
    existing = _listing(fs, root, out)
    foreign = [r for r in written if r in existing and r not in previous and r != MANIFEST]
    if foreign:
        raise ConfigError(
            [
                Problem(
                    "--out",
                    f"{out}: the export would replace {_names(foreign)}, which no rpeg export "
                    "wrote; nothing was written",
                )
            ]
        )
    fs.makedirs(root, exist_ok=True)
    # the manifest first lists both exports' files: an interrupted move leaves none unlisted
    _write_manifest(fs, root, {**previous, **written})
    move: Callable[[str, str], None] = os.replace if local else fs.put_file
    for rel in sorted(written):
        dst = f"{root}/{rel}"
        if "/" in rel:
            fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
        move(os.path.join(stage, rel), dst)
    for rel in sorted(set(previous) - set(written)):
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(f"{root}/{rel}")
    _write_manifest(fs, root, written)


def _write_manifest(fs: Any, root: str, files: dict[str, int]) -> None:
    with fs.open(f"{root}/{MANIFEST}", "w") as fh:
        json.dump({"written_by": "rpeg export", "files": dict(sorted(files.items()))}, fh)
