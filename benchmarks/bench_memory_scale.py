"""A model larger than one worker trains: predicted vs measured peak memory per rank.

    python benchmarks/bench_memory_scale.py [--steps 2] [--dp 1 2 4] [--prompts 16]
                                            [--worker-memory auto|4.03GB]

The built-in model widened to 302M parameters (hidden 1536, MLP 6144, 8 layers, 12 heads:
the configuration of issue 38), GRPO on the arithmetic task, every unit on ``dp`` CPU
workers with an FSDP trainer. For each dp it prints the unsharded training state (fp32
weights + gradients + AdamW + the fp32 reference = 20 bytes a parameter), the worker memory
limit, each rank's predicted peak (``rpeg predict``'s per-rank figure,
rpeg.compile.memory.rank_peaks) and measured peak (the rank process's VmHWM, from the run
summary), and a summary line. With ``--worker-memory`` at two thirds of the state, dp=1 is
refused before start (a named memory error) and dp >= 2 trains. Slow on 2 cores: minutes per
step at the default workload; ``--prompts 2`` measures the same layout in about a minute per
dp.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

SHAPE = {
    "hidden_size": 1536,
    "intermediate_size": 6144,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
}
UNITS = (
    "generate",
    "reward",
    "ref_logprob",
    "old_logprob",
    "advantage",
    "train_actor",
    "sync_weights",
)


def config(dp: int, steps: int, prompts: int, worker_memory: str, out: str):
    from rpeg.config import RunConfig

    devs = f"0-{dp - 1}" if dp > 1 else "0"
    units = {u: {"devices": devs} for u in UNITS}
    units["train_actor"]["engine"] = "fsdp"
    return RunConfig().with_overrides(
        {
            "model.tiny_shape": SHAPE,
            "optim.warmup_sft_steps": 0,
            "task.heldout_size": 8,
            "workload.num_prompts": prompts,
            "cluster.n_workers": dp,
            "cluster.num_devices": dp,
            "cluster.worker_memory": worker_memory,
            "runtime.steps": steps,
            "runtime.checkpoint_every": 100,
            "runtime.output_dir": out,
            "plan": {
                "cluster": "local-cpu",
                "model": "rpeg-tiny",
                "staleness": 0,
                "graph": {"builder": None},
                "units": units,
            },
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--worker-memory", default="auto")
    a = ap.parse_args()
    from rpeg.flows.entry import train as run_train

    from rpeg.errors import ConfigError
    from rpeg.specs.hf import tiny_model

    params = tiny_model(SHAPE).params
    state_gb = 20.0 * params / 1e9
    print(f"model: {params / 1e6:.1f}M parameters; unsharded training state {state_gb:.2f} GB")
    rows = []
    for dp in a.dp:
        out = tempfile.mkdtemp(prefix=f"rpeg-mem-dp{dp}-")
        cfg = config(dp, a.steps, a.prompts, a.worker_memory, out)
        t0 = time.time()
        try:
            s = run_train(cfg, summary_json=str(Path(out, "summary.json")), progress=False)
        except ConfigError as exc:
            print(f"dp={dp}: refused before start in {time.time() - t0:.1f} s: {exc}")
            rows.append((dp, None, None))
            continue
        pred = s["predicted_peak_memory"]
        for group, ranks in s["peak_memory"].items():
            measured = [r["peak_rss_bytes"] / 1e9 for r in ranks]
            p = pred[group]["peak_gb"]
            print(
                f"dp={dp} group {group}: limit {a.worker_memory}; predicted {p:.2f} GB per rank "
                f"({pred[group]['phase']}); measured {', '.join(f'{m:.2f}' for m in measured)} GB "
                f"({100 * (max(measured) / p - 1):+.0f}%); {time.time() - t0:.0f} s"
            )
            print("  parts:", json.dumps({k: round(v, 3) for k, v in pred[group]["parts"].items()}))
            rows.append((dp, p, max(measured)))
    ran = [(dp, p, m) for dp, p, m in rows if m is not None]
    worst = max((abs(m / p - 1) for _, p, m in ran), default=float("nan"))
    print(
        "summary: "
        + "; ".join(
            f"dp={dp} " + ("refused" if m is None else f"{m:.2f} GB measured / {p:.2f} predicted")
            for dp, p, m in rows
        )
        + f"; worst predicted-vs-measured {100 * worst:.0f}%"
    )


if __name__ == "__main__":
    main()
