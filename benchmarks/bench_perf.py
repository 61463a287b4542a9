"""Time to evaluate one plan for a 256-GPU cluster (target < 1 ms on the 2-core CI box).

Run: python benchmarks/bench_perf.py
"""

from __future__ import annotations

import time

from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.plan import colocated_plan, disaggregated_plan


def main(n: int = 2000) -> float:
    wl = Workload(
        num_prompts=512,
        samples_per_prompt=16,
        mean_prompt_tokens=256,
        max_response_tokens=8192,
        mean_response_tokens=3000,
        train_minibatches=4,
    )
    g = builders.build("grpo", use_reference=True, staleness=1)
    plans = [
        disaggregated_plan(
            g,
            "dgx-h100",
            num_nodes=32,
            gen_devices=128,
            train_devices=128,
            model="qwen3-32b",
            gen_tp=4,
            tp=4,
            pp=4,
        ),
        colocated_plan(g, "dgx-h100", num_nodes=32, model="qwen3-30b-a3b", gen_tp=2, ep=8),
    ]
    for p in plans:
        predict(g, p, wl)
    best = float("inf")
    for p in plans:
        t0 = time.perf_counter()
        for _ in range(n):
            predict(g, p, wl)
        per = (time.perf_counter() - t0) / n
        best = min(best, per)
        print(
            f"{p.model:16s} {len(p.units)} units on {p.num_devices} GPUs: {per * 1e6:8.1f} us/plan"
        )
    worst = per
    print(
        f"SUMMARY perf-model plan evaluation (256 GPUs): {worst * 1e3:.3f} ms/plan (target < 1 ms)"
    )
    return worst


if __name__ == "__main__":
    main()
