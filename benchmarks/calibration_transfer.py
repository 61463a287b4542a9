"""Does calibrating on one measured run improve the predictions of the others on the same
machine? (issue 13, item 5.)

Each argument is ``RUN_DIR:CONFIG`` (a run's output folder, with timeline.json and
metrics.jsonl, and the YAML it ran). The first is calibrated on (into a temporary specs dir,
nothing of the user's is touched); every run is predicted with the shipped constants and
with the fitted ones, against its measured median step (first step left out), at its
measured prompt and response lengths (``rpeg.perf.calibration.fit.measured_workload``: the benchmark
judges the rates, not the length guess of a config that leaves the mean prompt unstated).

    rpeg train configs/builtin.yaml --steps 6      # and the sharded / async configs
    python benchmarks/calibration_transfer.py runs/builtin:configs/builtin.yaml \\
        runs/sharded:configs/sharded-cpu.yaml runs/async:configs/async-cpu.yaml
"""

from __future__ import annotations

import os
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or any(":" not in a for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    from rpeg.compile.sources import resolve
    from rpeg.config import RunConfig
    from rpeg.perf.calibration import SHIPPED, fit, machine_calibration
    from rpeg.perf.prediction import Workload

    cases = []
    for a in args:
        run, cfg_path = a.split(":", 1)
        cfg = RunConfig.from_yaml(cfg_path)
        graph, plan = resolve(None, cfg)
        cases.append((run, graph, plan, Workload.from_config(cfg.workload), fit.read_run(run)))
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("RPEG_SPECS_DIR")
        os.environ["RPEG_SPECS_DIR"] = tmp
        try:
            run, graph, plan, wl, measured = cases[0]
            values, _ = fit.fit(fit.predictor(graph, plan, wl, measured), measured)
            fit.write(plan.cluster, values, f"calibration_transfer on {run}")
            print(f"calibrated on {run}: " + ", ".join(f"{k}={v:.3g}" for k, v in values.items()))
            errs = {"before": [], "after": []}
            for run, graph, plan, wl, measured in cases:
                pred = fit.predictor(graph, plan, wl, measured)
                before = pred(SHIPPED).step_s
                after = pred(machine_calibration(plan.cluster)).step_s
                m = measured.step_s
                errs["before"].append(abs(before - m) / m)
                errs["after"].append(abs(after - m) / m)
                print(
                    f"{run:32s} measured {m:7.3f} s  before {before:7.3f} s ({100 * (before - m) / m:+6.1f}%)"
                    f"  after {after:7.3f} s ({100 * (after - m) / m:+6.1f}%)"
                )
            others = slice(1, None)
            for k, v in errs.items():
                rest = v[others]
                print(
                    f"SUMMARY {k}: MAPE all {100 * sum(v) / len(v):.1f}%"
                    + (f", others {100 * sum(rest) / len(rest):.1f}%" if rest else "")
                )
        finally:
            if old is None:
                os.environ.pop("RPEG_SPECS_DIR", None)
            else:
                os.environ["RPEG_SPECS_DIR"] = old
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
