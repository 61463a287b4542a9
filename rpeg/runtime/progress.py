"""Training progress a person can follow, the same on both runtimes (the local trainer and
the distributed runtime's step sink): a bar when stdout is a terminal, one line per step when
it is not (a log file, SLURM, CI), where a bar shows nothing until the end."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

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


__all__ = ["REFRESH_PER_S", "StepProgress", "step_line"]
