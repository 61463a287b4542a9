"""A worker that stops answering without dying (SIGSTOP, a hung process): warned about, then
handled as lost (issue 28: a worker stopped for 60 s stalled the step with no warning).

:class:`StallWatch` decides (no I/O): fed which workers answered a ping at a time, it says
``Warn(worker, silent_s)`` once a worker has been silent for ``warn_s`` and
``Lost(worker, silent_s)`` after ``lost_s`` (0: never). :class:`StallMonitor` is its I/O: a
daemon thread that pings the run's workers (``Cluster.answering``) every ``every_s``, logs the
warning naming the worker and its ranks, and ends a lost worker's process from its nanny
(``Cluster.kill_from_nanny``: SIGKILL reaches a stopped process); the pending actor call then
fails with a lost worker and the run recovers as from a kill (docs/faults.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Warn:
    worker: str
    silent_s: float


@dataclass(frozen=True)
class Lost:
    worker: str
    silent_s: float


@dataclass
class StallWatch:
    warn_s: float
    lost_s: float
    last_ok: dict[str, float] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    declared: set[str] = field(default_factory=set)

    def seen(self, workers: Iterable[str], answered: set[str], now: float) -> list[Any]:
        out: list[Any] = []
        for w in workers:
            if w in answered or w not in self.last_ok:
                self.last_ok[w] = now
                self.warned.discard(w)
                continue
            silent = now - self.last_ok[w]
            if self.lost_s and silent >= self.lost_s and w not in self.declared:
                self.declared.add(w)
                out.append(Lost(w, silent))
            elif silent >= self.warn_s and w not in self.warned and w not in self.declared:
                self.warned.add(w)
                out.append(Warn(w, silent))
        return out


class StallMonitor:
    """Pings ``workers()`` every ``every_s`` in a daemon thread (see the module doc)."""

    def __init__(
        self,
        cluster: Any,
        workers: Callable[[], dict[str, str]],
        warn_s: float,
        lost_s: float,
        every_s: float = 5.0,
    ):
        self.cluster = cluster
        self.workers = workers  # worker address -> what runs there ("group rank r, ...")
        self.watch = StallWatch(warn_s, lost_s)
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rpeg-stall-watch", daemon=True)
        self.events: list[Any] = []

    def start(self) -> StallMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.tick(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - a failed ping round is tried again
                log.debug("stall watch: %s", exc)

    def tick(self, now: float) -> list[Any]:
        held = self.workers()
        answered = self.cluster.answering(list(held), timeout_s=min(self.every_s, 10.0))
        out = self.watch.seen(held, answered, now)
        for ev in out:
            what = held.get(ev.worker, "")
            if isinstance(ev, Warn):
                log.warning(
                    "worker %s (%s) has not answered for %.0f s (stopped or hung?); it is "
                    "handled as lost after runtime.worker_lost_after_s",
                    ev.worker,
                    what,
                    ev.silent_s,
                )
            else:
                log.warning(
                    "worker %s (%s) has not answered for %.0f s: handled as lost (its process "
                    "is killed; the run recovers from its last checkpoint)",
                    ev.worker,
                    what,
                    ev.silent_s,
                )
                self.cluster.kill_from_nanny([ev.worker])
        self.events += out
        return out
