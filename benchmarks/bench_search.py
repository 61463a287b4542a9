"""Time the optimizer on a 256-GPU GH200 search (target: under 30 s on a 2-core machine).

    python benchmarks/bench_search.py [--gpus 256] [--model qwen2.5-32b] [--algo grpo]

Prints one line per run and a summary line. All step times are model predictions.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--model", default="qwen2.5-32b")
    ap.add_argument("--algo", action="append", help="repeatable; default grpo and ppo")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    from rpeg.search import optimize

    times = []
    for algo in args.algo or ["grpo", "ppo"]:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = optimize(
                model=args.model,
                gpu="gh200",
                gpus=args.gpus,
                algo=algo,
                num_prompts=512,
                samples_per_prompt=16,
                max_response_tokens=8192,
                max_staleness=2,
            )
            dt = time.perf_counter() - t0
            times.append(dt)
            c = r.counts.to_dict()
            sp = r.speedups()
            print(
                f"{algo} {args.model} x{args.gpus} gh200: search {dt:.1f} s (wall, incl. baselines) | "
                f"{c['placements']} cells, {c['pruned_by_bound']} pruned by bound, {c['evaluated']} plans priced, "
                f"rejected {c['infeasible']} | best {r.best.step_s:.1f} s/step: {r.best.describe()} | "
                f"vs verl {sp['verl'] or float('nan'):.2f}x, ReaL {sp['real'] or float('nan'):.2f}x, "
                f"AReaL {sp['areal'] or float('nan'):.2f}x"
            )
    ok = max(times) < 30.0
    print(
        f"SUMMARY search_s median={statistics.median(times):.1f} max={max(times):.1f} "
        f"target<30s {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
