"""One train step at fp32, at bf16 (autocast, fp32 master weights: rpeg.runtime.precision)
and with the whole model cast to bf16 (the runtime before issue 26), interleaved.

    python benchmarks/bench_precision.py [--rounds 5] [--threads 1]

rpeg-tiny's default shape (4 layers x 256), GRPO on the sharding tests' fixed 8-row batch
(tests/runtime/sharding_cases.py), one process. Prints each variant's median ``train_step``
seconds and a SUMMARY line with the ratios to fp32. On a CPU without bf16 instructions
(no AVX-512-BF16 / AMX) bf16 is emulated and much slower than fp32.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
import sharding_cases as C  # noqa: E402

from rpeg.runtime.model_io import create_tiny  # noqa: E402


def _worker(variant: str):
    m, tok = create_tiny(seed=0)
    if variant == "bf16_cast":  # before issue 26: every weight and AdamW state in bf16
        return C.policy(C.config(), m.to(torch.bfloat16), tok)
    prec = "bf16" if variant == "bf16_autocast" else "fp32"
    return C.policy(C.config(**{"workload.precision": prec}), m, tok)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    workers = {v: _worker(v) for v in ("fp32", "bf16_autocast", "bf16_cast")}
    batches = {v: C.with_old_logprobs(C.batch(0), w) for v, w in workers.items()}
    times: dict[str, list[float]] = {v: [] for v in workers}
    for _ in range(a.rounds):
        for v, w in workers.items():
            t = time.perf_counter()
            w.train_step(batches[v])
            times[v].append(time.perf_counter() - t)
    med = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
    for v, t in times.items():
        print(f"{v:14s} median {med[v]:.3f} s  runs {[round(x, 3) for x in t]}")
    print(
        "SUMMARY train_step median s: "
        + ", ".join(f"{v} {med[v]:.3f} ({med[v] / med['fp32']:.2f}x fp32)" for v in med)
    )


if __name__ == "__main__":
    main()
