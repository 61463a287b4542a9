"""The samples a distributed run logs (a part of
:class:`rpeg.runtime.actors.driver.DistributedRun`): each logged step's rows, merged from its
ranks, kept in :attr:`SampleLog.logged` and appended to ``samples.jsonl`` (a few printed) by a
thread of its own, in step order, off the step's path (128 rows cost ~15 ms of JSON);
:meth:`SampleLog.flush` waits for them (before a checkpoint, a recovery and at close)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


def append_and_print(out_dir: str, rows: list[Any]) -> None:
    """One logged step's rows -> samples.jsonl, and a few of them printed."""
    from rpeg.runtime import samples as SM

    SM.append_samples(out_dir, rows)
    for line in SM.sample_lines(rows):
        print(line, flush=True)


class SampleLog:
    """samples.jsonl of a run in ``out_dir`` (``fresh``: a new run, the old file removed)."""

    def __init__(self, out_dir: str, *, fresh: bool):
        self.out_dir = out_dir
        self.logged: list[list[Any]] = []  # rpeg.runtime.samples rows, per logged step
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        if fresh:
            from rpeg.runtime.samples import SAMPLES_FILE

            Path(out_dir, SAMPLES_FILE).unlink(missing_ok=True)

    def write(self, got: list[Any]) -> None:
        """A logged step's rows from its advantage unit's ranks -> ``logged`` at once, and
        samples.jsonl by the writer thread; an earlier step's failed write raises here."""
        if not got:
            return
        from rpeg.runtime import samples as SM

        rows = SM.merge(got)
        with self._lock:
            done = [f for f in self._pending if f.done()]
            self._pending = [f for f in self._pending if f not in done]
        for f in done:  # an earlier step's failed write fails this unit
            f.result()
        with self._lock:
            self.logged.append(rows)
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="rpeg-samples")
            self._pending.append(self._writer.submit(append_and_print, self.out_dir, rows))

    def flush(self) -> None:
        """Wait until every logged step's rows are in samples.jsonl; a failed write raises."""
        with self._lock:
            pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        """Flush, then stop the writer thread."""
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None


__all__ = ["SampleLog", "append_and_print"]
