"""Training progress a person can follow, the same on both runtimes (the local trainer and
the distributed runtime's step sink): a bar when stdout is a terminal, one line per step when
it is not (a log file, SLURM, CI), where a bar shows nothing until the end.

Before the first step (config checks, the Prefect API, the Dask cluster, model load, the
warm-up, the first held-out evaluation) :class:`StartupTicker` says what is happening: a
``start-up: ...`` line when a phase begins, and, while nothing else was printed for
:data:`TICK_S` seconds, the phase again with its time so far -- plain lines, on a terminal
and in a log file alike. It stops at the first step."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping

#: before the first step, at most this many seconds pass without a line (issue 41: 9.5
#: minutes of silence after "models load now" read as a hang)
TICK_S = 5.0

#: progress-bar redraws per second (rich's default, 10, took ~0.05 of a core in the flow
#: process on a terminal -- CPU the ranks share -- for a bar that moves once per step)
REFRESH_PER_S = 2


def step_line(done: int, total: int, m: Mapping[str, float]) -> str:
    """One step's line: ``step 3/10: reward 0.250 acc 0.500 len 12.0 kl 0.0012 clip 0.000
    1.52s 410 tok/s`` (kl, clip and tok/s when the step reports them)."""
    parts = [
        f"step {done}/{total}: reward {m.get('reward_mean', 0.0):.3f}",
        f"acc {m.get('accuracy', 0.0):.3f} len {m.get('response_length', 0.0):.1f}",
    ]
    if "kl" in m:
        parts.append(f"kl {m['kl']:.4f}")
    if "clip_frac" in m:
        parts.append(f"clip {m['clip_frac']:.3f}")
    parts.append(f"{m.get('step_s', 0.0):.2f}s")
    if "tokens_per_s" in m:
        parts.append(f"{m['tokens_per_s']:.0f} tok/s")
    return " ".join(parts)


def _print(line: str) -> None:
    print(line, flush=True)


class StepProgress:
    """``update(done, metrics)`` after each step, ``close()`` at the end.

    ``enabled=False`` shows nothing. ``bar``: a rich progress bar (default: when stdout is a
    terminal); otherwise one :func:`step_line` per step through ``echo`` (default: print,
    flushed). ``start``: steps already done (a resumed run's bar starts there)."""

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        *,
        echo: Callable[[str], None] | None = None,
        bar: bool | None = None,
        start: int = 0,
    ):
        self.total = total
        self.echo = echo or _print
        self.p = None
        use_bar = sys.stdout.isatty() if bar is None else bar
        self.lines = enabled and not use_bar
        if enabled and use_bar:
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.p = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("reward {task.fields[reward]:.3f}"),
                TextColumn("{task.fields[tps]:.0f} tok/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
                refresh_per_second=REFRESH_PER_S,
            )
            self.t = self.p.add_task("rl", total=total, completed=start, reward=0.0, tps=0.0)
            self.p.start()

    def update(self, done: int, m: Mapping[str, float]) -> None:
        current_ticker().stop()  # the steps are the progress from now on
        if self.lines:
            self.echo(step_line(done, self.total, m))
        if self.p is not None:
            self.p.update(
                self.t,
                completed=done,
                reward=m.get("reward_mean", 0.0),
                tps=m.get("tokens_per_s", 0.0),
            )

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()
            self.p = None


class StartupTicker:
    """Start-up progress (module doc). ``phase(label)`` prints ``start-up: label`` and makes
    it the phase; ``echo(line)`` prints a line (it counts as progress); a thread repeats the
    phase with its seconds so far whenever :data:`TICK_S` passed without a line; ``stop()``
    ends it (idempotent). ``enabled=False`` prints nothing."""

    def __init__(
        self,
        enabled: bool = True,
        *,
        echo: Callable[[str], None] | None = None,
        every_s: float = TICK_S,
    ):
        self.enabled = enabled
        self._echo = echo or _print
        self.every_s = every_s
        self.label = ""
        self._t_phase = self._t_last = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> StartupTicker:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rpeg-ticker", daemon=True)
            self._thread.start()
        return self

    def echo(self, line: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._t_last = time.monotonic()
            self._echo(line)

    def phase(self, label: str) -> None:
        self.label = label
        self._t_phase = time.monotonic()
        if not self._stop.is_set():
            self.echo(f"start-up: {label}")

    def _loop(self) -> None:
        while not self._stop.wait(min(0.5, self.every_s / 4)):
            now = time.monotonic()
            if self.label and now - self._t_last >= self.every_s:
                self.echo(f"start-up: {self.label} ({now - self._t_phase:.0f} s so far)")

    def stop(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2)
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = _OFF


_OFF = StartupTicker(enabled=False)
_CURRENT = _OFF


def startup_ticker(enabled: bool = True, **kw) -> StartupTicker:
    """A started :class:`StartupTicker`, the process's current one (:func:`current_ticker`)
    until it stops."""
    global _CURRENT
    _CURRENT.stop()
    t = StartupTicker(enabled, **kw).start()
    if enabled:
        _CURRENT = t
    return t


def current_ticker() -> StartupTicker:
    """The running ticker (a silent one when none runs)."""
    return _CURRENT


def announce(line: str, label: str | None = None) -> None:
    """A start-up line: through the running ticker (it becomes the phase when ``label``),
    else printed."""
    t = current_ticker()
    if t.enabled:
        if label is not None:
            t.label, t._t_phase = label, time.monotonic()
        t.echo(line)
    else:
        _print(line)


__all__ = [
    "REFRESH_PER_S",
    "TICK_S",
    "StartupTicker",
    "StepProgress",
    "announce",
    "current_ticker",
    "startup_ticker",
    "step_line",
]
