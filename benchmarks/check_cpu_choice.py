"""Does the optimizer rank the runnable CPU plans like measured runs do?

On this machine (cluster ``local-cpu``, 2 devices; model ``rpeg-tiny``) the runnable plans are
sync vs k=1, fused (generate+reward) vs unfused, and one vs two data-parallel workers
(disaggregated 1+1 vs colocated on 2). Each is priced by the optimizer's model
(``rpeg.search.optimizer.solve``) and run for a few steps through the runtime entry
``rpeg.flows.entry.train(config)``; the script prints predicted vs measured median step
time, the rank correlation, and whether the optimizer's pick is the measured fastest.

    python benchmarks/check_cpu_choice.py [--steps 6] [--config run.yaml]

Exits non-zero (and says why) when the runtime entry is missing: it never fakes numbers.
"""

from __future__ import annotations

import argparse
import sys


def runnable_plans(prob):
    from rpeg.search.space import Placement, Structure

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


def _mean_prompt_tokens(cfg, n: int = 256) -> float:
    """Mean prompt length in tokens of the run's task (its data, the runtime's tokenizer)."""
    from rpeg.runtime.task_data import build_task_data

    cursor, _ = build_task_data(cfg.task)
    # the built-in tokenizer is character-level and puts <bos> in front
    lens = [len(ex.prompt(cfg.task.prompt_template)) + 1 for ex in cursor.next(n)]
    return sum(lens) / len(lens)


def _unit_medians(extra: dict) -> dict[str, float]:
    """Median measured duration per execution unit (steps after the first)."""
    import statistics

    by: dict[str, list[float]] = {}
    for r in extra.get("timeline", []):
        if int(r.get("step", 0)) >= 1:
            by.setdefault(r["stage"], []).append(float(r["end_s"]) - float(r["start_s"]))
    return {k: statistics.median(v) for k, v in by.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (order reversed)")
    ap.add_argument("--config", help="run config YAML (default: the built-in CPU config)")
    ap.add_argument("--json", help="write predicted/measured rows here")
    ap.add_argument("--predict-only", action="store_true", help="price the plans, run nothing")
    ap.add_argument(
        "--mean-response-tokens",
        type=float,
        default=3.0,
        help="mean response length the model assumes (measured on the built-in arithmetic "
        "task: metrics.jsonl response_length 2.8-3.0 over 32 steps of 8 runs)",
    )
    args = ap.parse_args()
    import json
    import os
    import statistics
    import tempfile

    from rpeg.config import RunConfig
    from rpeg.search.optimizer import solve
    from rpeg.search.problem import problem_from_config

    base = RunConfig.from_yaml(args.config) if args.config else RunConfig()
    base = base.with_overrides(
        {
            "runtime.steps": args.steps,
            "runtime.max_staleness": 1,
            "cluster.name": "local-cpu",
            "model.name": "rpeg-tiny",
        }
    )
    # describe the workload as it is: the task's mean prompt length in tokens (measured from
    # its data with the runtime's tokenizer) and the measured mean response length
    base = base.with_overrides(
        {
            "workload.mean_prompt_tokens": _mean_prompt_tokens(base),
            "workload.mean_response_tokens": args.mean_response_tokens,
        }
    )
    print(
        f"workload: {base.workload.num_prompts}x{base.workload.samples_per_prompt} samples, "
        f"mean prompt {base.workload.mean_prompt_tokens:.1f} tokens, "
        f"mean response {base.workload.mean_response_tokens:.1f} tokens"
    )
    prob = problem_from_config(base)
    cands = []
    for st, pl in runnable_plans(prob):
        cand = solve(prob, st, pl)
        if cand is None:
            print(f"{st.describe()}; {pl.describe()}: infeasible under the model (skipped)")
            continue
        cands.append(cand)
    if args.predict_only:
        for c in cands:
            units = " ".join(f"{n}={s.time_s:.3f}" for n, s in c.prediction.stages.items())
            print(f"{c.describe():60s} predicted {c.step_s:7.3f} s  [{units}]")
        return 0
    try:
        from prefect.testing.utilities import prefect_test_harness
        from rpeg.flows.entry import train_on
        from rpeg.infra import start_cluster
    except ImportError as exc:
        print(
            f"runtime entry rpeg.flows.entry.train_on is not available ({exc}); "
            "cannot measure, no numbers reported",
            file=sys.stderr,
        )
        return 2
    tmp = tempfile.mkdtemp(prefix="rpeg-cpu-choice-")
    steps: dict[int, list[float]] = {}
    units: dict[int, dict[str, list[float]]] = {}
    failed: dict[int, str] = {}
    with prefect_test_harness(server_startup_timeout=120), start_cluster(n_workers=2) as cl:
        for r in range(args.rounds):
            order = list(range(len(cands)))
            if r % 2:
                order.reverse()
            for i in order:
                if i in failed:
                    continue
                cand = cands[i]
                cfg = base.model_copy(deep=True)
                cfg.runtime.max_staleness = cand.structure.staleness
                cfg.runtime.output_dir = f"{tmp}/p{i}r{r}"
                cfg.plan = cand.plan.to_dict()
                try:
                    s = train_on(cl, cfg, progress=False)
                except Exception as exc:  # a plan the runtime cannot execute is reported
                    failed[i] = f"{type(exc).__name__}: {exc}"
                    print(f"{cand.describe()}: runtime refused or failed: {failed[i]}")
                    continue
                hist = s["_extra"]["history"]
                steps.setdefault(i, []).extend(h["step_s"] for h in hist[1:])  # drop step 0
                for u, v in _unit_medians(s["_extra"]).items():
                    units.setdefault(i, {}).setdefault(u, []).append(v)
                print(
                    f"round {r} {cand.describe()}: median {statistics.median(steps[i]):.3f} s",
                    flush=True,
                )
    rows = []
    for i, cand in enumerate(cands):
        if i not in steps or i in failed:
            continue
        measured = statistics.median(steps[i])
        mu = {u: statistics.median(v) for u, v in units.get(i, {}).items()}
        rows.append((cand, measured, mu))
    if len(rows) < 2:
        print("fewer than two plans ran: no ranking to compare", file=sys.stderr)
        return 1
    print()
    print(f"{'plan':60s} {'predicted':>9s} {'measured':>9s}  units predicted/measured (s)")
    for cand, measured, mu in rows:
        us = " ".join(
            f"{n}={s.time_s:.3f}/{mu.get(n, float('nan')):.3f}"
            for n, s in cand.prediction.stages.items()
        )
        print(f"{cand.describe():60s} {cand.step_s:9.3f} {measured:9.3f}  {us}")
    pred = [c.step_s for c, _, _ in rows]
    meas = [m for _, m, _ in rows]
    rho = spearman(pred, meas)
    pick = min(range(len(rows)), key=lambda i: pred[i])
    fastest = min(range(len(rows)), key=lambda i: meas[i])
    mape = statistics.mean(abs(p - m) / m for p, m in zip(pred, meas, strict=True))
    print(
        f"SUMMARY plans={len(rows)} steps={args.steps} rounds={args.rounds} spearman={rho:.2f} "
        f"mape={mape:.0%} optimizer_pick='{rows[pick][0].describe()}' "
        f"measured_fastest='{rows[fastest][0].describe()}' pick_is_fastest={pick == fastest} "
        f"pick_regret={meas[pick] / meas[fastest]:.2f}x load_avg={os.getloadavg()[0]:.1f}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                [
                    {
                        "plan": c.describe(),
                        "predicted_s": c.step_s,
                        "measured_s": m,
                        "units_predicted_s": {n: s.time_s for n, s in c.prediction.stages.items()},
                        "units_measured_s": mu,
                    }
                    for c, m, mu in rows
                ],
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
