"""What the terminal shows of Prefect's logs during ``rpeg train``: an :class:`RpegError`
by its message alone (``--debug`` restores the tracebacks)."""

from __future__ import annotations

import logging


class NoTracebackForKnownErrors(logging.Formatter):
    """A console formatter that leaves out the traceback of an :class:`RpegError` (bad input,
    a full disk, a lost worker that could not be recovered): its message says what is wrong
    and the command prints it once more at the end; other errors keep theirs. Prefect's
    task and flow loggers would otherwise print each such error with two tracebacks."""

    def __init__(self, inner: logging.Formatter):
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        from rpeg.errors import RpegError

        if not (record.exc_info and isinstance(record.exc_info[1], RpegError)):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info = record.exc_text = None  # other handlers see the record unchanged
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved


def console_without_known_tracebacks() -> None:
    """Wrap the formatter of Prefect's console handler (on the root logger) once."""
    for h in logging.getLogger().handlers:
        if type(h).__name__ == "PrefectConsoleHandler" and not isinstance(
            h.formatter, NoTracebackForKnownErrors
        ):
            h.setFormatter(NoTracebackForKnownErrors(h.formatter or logging.Formatter()))
