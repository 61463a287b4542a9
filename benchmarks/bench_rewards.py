"""Reward cost inline vs through the verifier pool (a non-main thread), per sample.

python benchmarks/bench_rewards.py [--samples 120]
"""

from __future__ import annotations

import argparse
import threading
import time

from rpeg.runtime.rewards import RewardSet

CASES = [
    ("1/2", "0.5"),
    ("\\frac{1}{2}", "0.5"),
    ("$\\boxed{4}$", "4"),
    ("<answer>7</answer>", "7"),
    ("x", "0.5"),
    ("3", "4"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=120)
    a = ap.parse_args()
    rs = RewardSet(["math_equivalence"])
    resp = [CASES[i % len(CASES)][0] for i in range(a.samples)]
    refs = [CASES[i % len(CASES)][1] for i in range(a.samples)]
    prompts = [""] * a.samples
    rs(prompts[:1], resp[:1], refs[:1])  # import math-verify
    t0 = time.perf_counter()
    inline = rs(prompts, resp, refs)
    t_inline = time.perf_counter() - t0
    out: dict = {}

    def on_thread() -> None:
        t = time.perf_counter()
        rs(prompts[:8], resp[:8], refs[:8])  # every child starts and imports math-verify
        out["first"] = time.perf_counter() - t
        t = time.perf_counter()
        out["res"] = rs(prompts, resp, refs)
        out["pool"] = time.perf_counter() - t

    th = threading.Thread(target=on_thread)
    th.start()
    th.join()
    assert out["res"].rewards == inline.rewards and out["res"].errors == 0
    n = a.samples
    print(
        f"inline (main thread): {t_inline * 1e3:.1f} ms for {n} ({t_inline / n * 1e3:.2f} ms/sample)"
    )
    print(
        f"pool, first call of 8 (children start, import math-verify): {out['first'] * 1e3:.0f} ms"
    )
    print(
        f"pool (thread): {out['pool'] * 1e3:.1f} ms for {n} ({out['pool'] / n * 1e3:.2f} ms/sample)"
    )


if __name__ == "__main__":
    main()
