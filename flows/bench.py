"""``rpeg bench``: run the chosen plan and the planner's baseline plans for a few steps
through the real runtime and lay predicted beside measured step time and speedup.

Each plan runs as its own ``rpeg train CONFIG --steps N`` process (the same path a user
runs, one at a time so they do not share the machine), writes ``metrics.jsonl`` in its own
folder, and is measured by the median step after ``skip`` warm-up steps and any further
warm-up (:func:`rpeg.perf.calibration.fit.read_run`). The prediction is shown twice: at the workload
`rpeg predict` prices (the config's lengths, else those ``rpeg calibrate`` kept for the model
and task, else the prior's: rpeg.perf.calibration.run_lengths) and at the lengths the run actually
produced, so a length miss is not mistaken for a rate miss. The table is also a Prefect
markdown artifact when a Prefect run is active (:func:`bench_flow`).
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BenchEntry:
    """One plan to run: its name, the run config that runs it, and what it was priced at."""

    name: str
    description: str
    config_path: Path
    predicted_s: float


@dataclass(frozen=True)
class BenchResult:
    name: str
    description: str
    predicted_s: float
    measured_s: float | None
    predicted_at_measured_s: float | None = None  # priced at the run's own lengths
    steps: int = 0
    error: str = ""
    # the fastest and slowest measured step: an error inside the run's own spread is noise
    measured_range: tuple[float, float] | None = None

    @property
    def error_pct(self) -> float | None:
        p = self.predicted_at_measured_s or self.predicted_s
        return None if not self.measured_s else 100.0 * (p - self.measured_s) / self.measured_s


#: runs one config for ``steps`` steps into ``out``; returns (exit code, last output lines)
Runner = Callable[[Path, int, Path], tuple[int, str]]


def subprocess_runner(config: Path, steps: int, out: Path) -> tuple[int, str]:
    """``rpeg train CONFIG --steps N --out OUT --quiet`` in a child process."""
    entry = "import sys; from rpeg.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", entry, "train", str(config)]
    cmd += ["--steps", str(steps), "--out", str(out), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
    return proc.returncode, tail


def run_entries(
    entries: list[BenchEntry],
    steps: int,
    out: Path,
    *,
    skip: int = 1,
    reprice: Callable[[BenchEntry, Any], float | None] | None = None,
    runner: Runner = subprocess_runner,
) -> list[BenchResult]:
    """Run each entry in turn and measure it; a run that fails is a row with its error."""
    from rpeg.perf.calibration.fit import RunDataError, read_run

    results = []
    for e in entries:
        run_dir = out / e.name
        code, tail = runner(e.config_path, steps, run_dir)
        if code != 0:
            results.append(
                BenchResult(
                    e.name, e.description, e.predicted_s, None, error=f"exit {code}: {tail}"
                )
            )
            continue
        try:
            # `rpeg train --out DIR` writes DIR/<run id>/ and points DIR/latest at it
            latest = run_dir / "latest"
            measured = read_run(latest if latest.exists() else run_dir, skip=skip)
        except (RunDataError, OSError) as exc:
            results.append(BenchResult(e.name, e.description, e.predicted_s, None, error=str(exc)))
            continue
        again = reprice(e, measured) if reprice is not None else None
        results.append(
            BenchResult(
                e.name,
                e.description,
                e.predicted_s,
                measured.step_s,
                predicted_at_measured_s=again,
                steps=measured.steps,
                measured_range=measured.step_range,
            )
        )
    return results


def speedups(results: list[BenchResult], chosen: str) -> dict[str, tuple[float, float | None]]:
    """name -> (predicted, measured) speedup of ``chosen`` over it (>1: chosen is faster)."""
    base = next((r for r in results if r.name == chosen), None)
    out: dict[str, tuple[float, float | None]] = {}
    if base is None:
        return out
    bp = base.predicted_at_measured_s or base.predicted_s
    for r in results:
        p = r.predicted_at_measured_s or r.predicted_s
        m = r.measured_s / base.measured_s if r.measured_s and base.measured_s else None
        out[r.name] = (p / bp, m)
    return out


def separated_pairs(
    results: list[BenchResult], separation: float = 0.15
) -> list[tuple[BenchResult, BenchResult]]:
    """Every (faster, slower) pair of measured plans whose predictions differ by at least
    ``separation`` (relative), the predicted-faster plan first."""
    ok = [r for r in results if r.measured_s]

    def pred(r: BenchResult) -> float:
        return r.predicted_at_measured_s or r.predicted_s

    return [(a, b) for a in ok for b in ok if pred(b) >= pred(a) * (1 + separation)]


def order_agrees(results: list[BenchResult], separation: float = 0.15) -> bool | None:
    """Whether the measured order equals the predicted order for every pair of plans the
    model separates by at least ``separation``; None when no pair is that far apart."""
    pairs = separated_pairs(results, separation)
    if not pairs:
        return None
    return all(a.measured_s < b.measured_s for a, b in pairs)  # type: ignore[operator]


def table(results: list[BenchResult], chosen: str) -> list[str]:
    """The side-by-side table as markdown lines."""
    sp = speedups(results, chosen)
    lines = [
        "| plan | predicted s | predicted at measured lengths s | measured s | measured steps s "
        "| error | predicted speedup of chosen | measured speedup of chosen |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        pa = f"{r.predicted_at_measured_s:.3f}" if r.predicted_at_measured_s else "-"
        ms = f"{r.measured_s:.3f}" if r.measured_s else f"failed ({r.error[:60]})"
        rg = "-" if not r.measured_range else "{:.3f}-{:.3f}".format(*r.measured_range)
        err = f"{r.error_pct:+.0f}%" if r.error_pct is not None else "-"
        ps, mspd = sp.get(r.name, (math.nan, None))
        lines.append(
            f"| {r.name}: {r.description} | {r.predicted_s:.3f} | {pa} | {ms} | {rg} | {err} "
            f"| {ps:.2f}x | {'-' if mspd is None else f'{mspd:.2f}x'} |"
        )
    errs = [abs(r.error_pct) for r in results if r.error_pct is not None]
    spreads = [
        100.0 * (r.measured_range[1] - r.measured_range[0]) / r.measured_s
        for r in results
        if r.measured_range and r.measured_s
    ]
    if errs:
        lines.append("")
        pairs = separated_pairs(results)
        agree = sum(a.measured_s < b.measured_s for a, b in pairs)  # type: ignore[operator]
        plans = len({r.name for pair in pairs for r in pair})
        verdict = {True: "as predicted", False: "differs", None: "n/a (no such pair)"}[
            order_agrees(results)
        ]
        # a run's own steps spread (the same work, other lengths, a busy machine): an error
        # smaller than that spread is not evidence against the model
        spread = (
            f"; a run's steps spread up to {max(spreads):.0f}% of its median" if spreads else ""
        )
        lines.append(
            f"mean |error| {statistics.mean(errs):.0f}% over {len(errs)} plans; "
            f"order of plans separated by >= 15%: {verdict} "
            f"({agree} of {len(pairs)} pairs, {plans} plans){spread}"
        )
    return lines


def bench_flow(
    entries: list[BenchEntry], steps: int, out: Path, skip: int, chosen: str, reprice: Any
) -> list[BenchResult]:
    """The runs as a Prefect flow: the table becomes a markdown artifact of the flow run."""
    from prefect import flow
    from rpeg.flows.artifacts import artifact_key, publish_markdown

    @flow(name="rpeg-bench", log_prints=False)
    def _bench() -> list[BenchResult]:
        res = run_entries(entries, steps, out, skip=skip, reprice=reprice)
        publish_markdown(
            "# rpeg bench\n\n" + "\n".join(table(res, chosen)) + "\n",
            key=artifact_key("rpeg-bench"),
            description="predicted vs measured step time and speedup",
        )
        return res

    return _bench()
