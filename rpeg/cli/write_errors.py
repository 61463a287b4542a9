"""A write that fails because the disk is full (or read-only, or over quota), named with its
file (issue 44: ``OSError: [Errno 28] No space left on device`` with no file when the output
disk filled up).

``open()`` errors carry their file (``exc.filename``); a failed ``write()`` or ``flush()`` does
not. Then the file is read from the failing frames: the innermost open file object
(``.name``), ``pathlib.Path`` receiver or local called ``path`` / ``filename`` / ``dst``. The
CLI prints ``error: disk full writing PATH (...)`` and exits 2 (a refusal of the machine, not
a bug); anything else is left as it was.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import PurePath
from types import TracebackType

#: errno -> what it means for a write
WRITE_ERRNOS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
_NAMES = ("path", "filename", "file", "dst", "out", "target")


def _named(value: object) -> str | None:
    if isinstance(value, io.IOBase | io.TextIOWrapper | io.BufferedWriter):
        name = getattr(value, "name", None)
        return name if isinstance(name, str) else None
    if isinstance(value, PurePath):
        return str(value)
    return None


def file_of(tb: TracebackType | None) -> str | None:
    """The file being written in the innermost frame of ``tb`` that names one."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        local = frame.f_locals
        for key in ("self", "fh", "f", "fp", *_NAMES):
            got = _named(local.get(key))
            if got:
                return got
        for key in _NAMES:
            v = local.get(key)
            if isinstance(v, str) and os.sep in v:
                return v
    return None


def write_error_message(exc: BaseException) -> str | None:
    """``disk full writing PATH (...)`` for a failed write of a full / read-only disk (the
    exception or one it was raised from), else None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
            what = WRITE_ERRNOS[exc.errno]
            path = exc.filename or file_of(exc.__traceback__)
            where = f"writing {path}" if path else "writing the run's outputs (file unknown)"
            return (
                f"{what} {where} ([Errno {exc.errno}] {exc.strerror}); free space, or write "
                "elsewhere (runtime.output_dir, --out)"
            )
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
