"""Does the optimizer rank the runnable CPU plans like measured runs do?

On this machine (cluster ``local-cpu``, 2 devices; model ``rpeg-tiny``) the runnable plans are
sync vs k=1, fused (generate+reward) vs unfused, and one vs two data-parallel workers
(disaggregated 1+1 vs colocated on 2). Each is priced by the optimizer's model
(``rpeg.plan.search.solve``) and run for a few steps through the runtime entry
``rpeg.flows.train.run_train(config)``; the script prints predicted vs measured median step
time, the rank correlation, and whether the optimizer's pick is the measured fastest.

    python benchmarks/check_cpu_choice.py [--steps 6] [--config run.yaml]

Exits non-zero (and says why) when the runtime entry is missing: it never fakes numbers.
"""

from __future__ import annotations

import argparse
import sys


def runnable_plans(prob):
    from rpeg.plan.space import Placement, Structure

    out = []
    for k in (0, 1):
        for fusion in ("none", "rollout"):
            for pl in (Placement(2, 0), Placement(2, 1, partial_rollout=False)):
                out.append((Structure(k, False, fusion), pl))
    return out


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    if n < 2:
        return float("nan")
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True))
    return 1 - 6 * d2 / (n * (n * n - 1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--config", help="run config YAML (default: the built-in CPU config)")
    args = ap.parse_args()
    try:
        from rpeg.flows.train import run_train
    except ImportError as exc:
        print(
            f"runtime entry rpeg.flows.train.run_train is not available ({exc}); "
            "cannot measure, no numbers reported",
            file=sys.stderr,
        )
        return 2
    from rpeg.config import RunConfig
    from rpeg.plan.search import problem_from_config, solve

    base = RunConfig.from_yaml(args.config) if args.config else RunConfig()
    base = base.with_overrides(
        {
            "runtime.steps": args.steps,
            "runtime.max_staleness": 1,
            "cluster.name": "local-cpu",
            "model.name": "rpeg-tiny",
        }
    )
    prob = problem_from_config(base)
    rows = []
    for st, pl in runnable_plans(prob):
        cand = solve(prob, st, pl)
        if cand is None:
            print(f"{st.describe()}; {pl.describe()}: infeasible under the model (skipped)")
            continue
        cfg = base.model_copy(deep=True)
        cfg.runtime.max_staleness = st.staleness
        cfg.plan = cand.plan.to_dict()
        try:
            summary = run_train(cfg, progress=False)
        except Exception as exc:  # a plan the runtime cannot execute is reported, not faked
            print(f"{cand.describe()}: runtime refused or failed: {type(exc).__name__}: {exc}")
            continue
        measured = float(summary["median_step_s"])
        rows.append((cand, measured))
        print(
            f"{cand.describe():60s} predicted {cand.step_s:8.3f} s  measured {measured:8.3f} s",
            flush=True,
        )
    if len(rows) < 2:
        print("fewer than two plans ran: no ranking to compare", file=sys.stderr)
        return 1
    pred = [c.step_s for c, _ in rows]
    meas = [m for _, m in rows]
    rho = spearman(pred, meas)
    pick = min(range(len(rows)), key=lambda i: pred[i])
    fastest = min(range(len(rows)), key=lambda i: meas[i])
    print(
        f"SUMMARY plans={len(rows)} spearman={rho:.2f} optimizer_pick='{rows[pick][0].describe()}' "
        f"measured_fastest='{rows[fastest][0].describe()}' pick_is_fastest={pick == fastest} "
        f"pick_regret={meas[pick] / meas[fastest]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
