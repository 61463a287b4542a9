"""Measured median step times: single-process trainer vs the distributed runtime.

    python benchmarks/bench_runtime.py [--steps 6] [--prompts 4] [--samples 4]

Runs (interleaved where possible, medians quoted): the single-process trainer, sync on Dask
(one rank), async k=1 (rollout and training on separate workers), fused (generate+reward)
vs unfused, and reports the Prefect+Dask overhead per step as ratios to the single-process
trainer. Prints one summary line at the end (``SUMMARY ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _cfg(out: str, steps: int, prompts: int, samples: int, **over):
    from rpeg.config import RunConfig

    d = {
        "workload": {
            "num_prompts": prompts,
            "samples_per_prompt": samples,
            "max_response_tokens": 12,
        },
        "task": {"heldout_size": 4},
        "runtime": {"steps": steps, "output_dir": out},
        "cluster": {"n_workers": 2, "num_devices": 1},
    }
    cfg = RunConfig.from_dict(d)
    return cfg.with_overrides(over) if over else cfg


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.train import run_train
    from rpeg.infra import start_cluster

    from rpeg.compile import compile_plan
    from rpeg.ir import build, fuse
    from rpeg.runtime.local import LocalTrainer

    tmp = tempfile.mkdtemp(prefix="rpeg-bench-")
    res: dict[str, float] = {}

    def med(hist):
        xs = [h["step_s"] for h in hist[1:]] or [h["step_s"] for h in hist]
        return statistics.median(xs)

    cfg = _cfg(f"{tmp}/local", a.steps, a.prompts, a.samples)
    t = LocalTrainer(cfg)
    res["local"] = med([t.step() for _ in range(a.steps)])
    with prefect_test_harness(server_startup_timeout=120), start_cluster(n_workers=2) as cl:
        runs = {
            "dask_sync": _cfg(f"{tmp}/sync", a.steps, a.prompts, a.samples),
            "dask_async_k1": _cfg(
                f"{tmp}/k1",
                a.steps,
                a.prompts,
                a.samples,
                **{"runtime.max_staleness": 1, "cluster.num_devices": 2},
            ),
        }
        g = fuse(build("grpo", group_size=a.samples), ["generate", "reward"])
        from rpeg.plan import colocated_plan

        plan = colocated_plan(g, num_devices=1)
        plan = plan.model_copy(
            update={"graph": plan.graph.model_copy(update={"inline": g.to_dict()})}
        )
        fused = _cfg(f"{tmp}/fused", a.steps, a.prompts, a.samples)
        fused = fused.model_copy(update={"plan": plan.to_dict()})
        runs["dask_fused"] = fused
        compile_plan(None, fused)
        for name, c in runs.items():
            s = run_train(c, progress=False, _cluster=cl, _with_extra=True)
            res[name] = med(s["_extra"]["history"])
            if name == "dask_async_k1" and s["_extra"]["weight_sync"]:
                ws = s["_extra"]["weight_sync"]
                res["weight_sync_s"] = statistics.median(w["weight_sync_s"] for w in ws)
                res["weight_sync_bytes"] = ws[0]["weight_sync_bytes"]
        t = LocalTrainer(_cfg(f"{tmp}/local2", a.steps, a.prompts, a.samples))
        res["local"] = statistics.median([res["local"], med([t.step() for _ in range(a.steps)])])
    base = res["local"]
    ratios = {k: res[k] / base for k in ("dask_sync", "dask_async_k1", "dask_fused")}
    res["overhead_per_step_s"] = res["dask_sync"] - base
    out = {"median_step_s": res, "ratio_to_local": ratios}
    print(json.dumps(out, indent=1))
    print(
        "SUMMARY "
        + " ".join(
            f"{k}={res[k]:.3f}s" for k in ("local", "dask_sync", "dask_async_k1", "dask_fused")
        )
        + " "
        + " ".join(f"{k}/local={v:.2f}" for k, v in ratios.items())
        + f" overhead={res['overhead_per_step_s']:.3f}s/step"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
    time.sleep(0)
