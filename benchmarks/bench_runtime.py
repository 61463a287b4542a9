"""Measured median step times: single-process trainer vs the distributed runtime.

    python benchmarks/bench_runtime.py [--steps 6] [--prompts 4] [--samples 4] [--rounds 2]

Runs, interleaved A/B over ``--rounds`` (order reversed every other round; medians of all
steps but each run's first): the single-process trainer, sync on Dask (one rank, unfused),
the same with generate+reward fused, async k=1 (rollout and training on separate workers),
and reports the Prefect+Dask overhead per step (sync minus single-process, and step time
outside the actor's stages) and ratios to the single-process trainer. Prints one summary
line at the end (``SUMMARY ...``). The machine is shared: quote medians, not single runs.
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


def _fused(cfg):
    """The same graph with generate+reward fused into one unit (one actor call per step)."""
    from rpeg.compile.compiler import graph_from_config
    from rpeg.ir import fuse
    from rpeg.plan import colocated_plan

    g = fuse(graph_from_config(cfg), ["generate", "reward"], name="rollout")
    plan = colocated_plan(g, num_devices=1, micro_batch_size=cfg.workload.micro_batch_size)
    plan = plan.model_copy(update={"graph": plan.graph.model_copy(update={"inline": g.to_dict()})})
    return cfg.model_copy(update={"plan": plan.to_dict()})


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved A/B rounds")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.train import run_train
    from rpeg.infra import start_cluster

    from rpeg.runtime.local_trainer import LocalTrainer

    tmp = tempfile.mkdtemp(prefix="rpeg-bench-")
    samples: dict[str, list[float]] = {}
    overhead: list[float] = []
    ws_s: list[float] = []
    ws_bytes = 0.0

    def steps_of(hist):
        return [h["step_s"] for h in hist[1:]] or [h["step_s"] for h in hist]  # skip step 0

    def configs(r: int) -> dict:
        base = _cfg(f"{tmp}/sync{r}", a.steps, a.prompts, a.samples)
        return {
            "dask_sync": base,
            "dask_fused": _fused(_cfg(f"{tmp}/fused{r}", a.steps, a.prompts, a.samples)),
            "dask_async_k1": _cfg(
                f"{tmp}/k1{r}",
                a.steps,
                a.prompts,
                a.samples,
                **{"runtime.max_staleness": 1, "cluster.num_devices": 2},
            ),
        }

    t_all = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120), start_cluster(n_workers=2) as cl:
        for r in range(a.rounds):  # interleave: local, sync, fused, async, then again
            t = LocalTrainer(_cfg(f"{tmp}/local{r}", a.steps, a.prompts, a.samples))
            samples.setdefault("local", []).extend(steps_of([t.step() for _ in range(a.steps)]))
            order = list(configs(r).items())
            if r % 2:
                order.reverse()
            for name, c in order:
                s = run_train(c, progress=False, _cluster=cl, _with_extra=True)
                hist = s["_extra"]["history"]
                samples.setdefault(name, []).extend(steps_of(hist))
                if name == "dask_sync":
                    # flow + Dask overhead: step time minus the time spent inside actor calls
                    inside: dict[int, float] = {}
                    for sp in s["_extra"]["stage_spans"]:
                        if sp["rank"] == 0:
                            inside[sp["step"]] = inside.get(sp["step"], 0.0) + (
                                sp["end_s"] - sp["start_s"]
                            )
                    overhead += [h["step_s"] - inside.get(int(h["step"]), 0.0) for h in hist[1:]]
                if name == "dask_async_k1":
                    ws = s["_extra"]["weight_sync"]
                    ws_s += [w["weight_sync_s"] for w in ws]
                    ws_bytes = ws[0]["weight_sync_bytes"] if ws else 0.0
    res = {k: statistics.median(v) for k, v in samples.items()}
    base = res["local"]
    ratios = {k: res[k] / base for k in ("dask_sync", "dask_fused", "dask_async_k1")}
    res["overhead_per_step_s"] = res["dask_sync"] - base
    res["outside_actor_per_step_s"] = statistics.median(overhead) if overhead else float("nan")
    res["fused_over_unfused"] = res["dask_fused"] / res["dask_sync"]
    if ws_s:
        res["weight_sync_s"] = statistics.median(ws_s)
        res["weight_sync_bytes"] = ws_bytes
    out = {
        "median_step_s": res,
        "ratio_to_local": ratios,
        "n_steps_per_config": {k: len(v) for k, v in samples.items()},
        "load_avg": os.getloadavg(),
        "wall_s": time.perf_counter() - t_all,
        "args": vars(a),
    }
    print(json.dumps(out, indent=1))
    print(
        "SUMMARY "
        + " ".join(
            f"{k}={res[k]:.3f}s" for k in ("local", "dask_sync", "dask_fused", "dask_async_k1")
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
