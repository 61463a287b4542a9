"""Measured median step times: single-process trainer vs the distributed runtime.

    python benchmarks/bench_runtime.py [--steps 6] [--prompts 4] [--samples 4] [--rounds 2]

Runs, interleaved A/B over ``--rounds`` (order reversed every other round; medians of all
steps but each run's first): the single-process trainer, sync on Dask (one rank, unfused),
the same with generate+reward fused, async k=1 (rollout and training on separate workers),
and reports the Prefect+Dask overhead per step (sync minus single-process, and step time
outside the actor's stages) and ratios to the single-process trainer. Prints one summary
line at the end (``SUMMARY ...``). The machine is shared: quote medians, not single runs.

Layouts (same run, interleaved, two workers): ``ddp_dp2`` (two full replicas, gradients
averaged), ``fsdp_dp2`` (FSDP2 over dp=2) and ``tp2`` (DTensor tensor parallelism over two
ranks): steps/s and peak RSS per rank. Weight sync of ``dask_async_k1``: measured seconds
(gloo broadcast trainer -> generator) next to the performance model's ``sync_weights``
prediction for the same plan on the ``local-cpu`` profile. ``--layouts ''`` skips them.
Streaming: the same k=0 plan (generator on worker 0, trainer on worker 1) with and without a
streaming rollout unit (the trainer's log-prob passes run on each group of prompts as soon as
their samples finish, while the rest decode), on a workload whose lengths vary
(``STREAM_WORKLOAD``, ``--stream-prompts``).

    python benchmarks/bench_runtime.py --configs configs/builtin.yaml,configs/sharded-cpu.yaml

runs shipped configs as they are instead (their own workload, cluster and plan): the
single-process trainer (what ``rpeg train --local`` runs) and the Prefect + Dask runtime
(what ``rpeg train`` runs), interleaved over ``--rounds`` in one process with one cluster
of as many workers as the largest config needs, and prints per config the median step of
each (``ratio`` = Dask / local) and the mean step (``total time ratio``: the ratio of the
runs' total step time). Runs are layout-invariant (docs/parallelism.md "Layout-invariant
runs"): both runtimes sample the same responses and train on the same mini-batches, so the
two time the same workload step by step; the line says at how many steps the mean response
length agreed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    from rpeg.compile.sources import graph_from_config
    from rpeg.ir import fuse, to_dict
    from rpeg.plan import colocated_plan

    g = fuse(graph_from_config(cfg), ["generate", "reward"], name="rollout")
    plan = colocated_plan(g, num_devices=1, micro_batch_size=cfg.workload.micro_batch_size)
    plan = plan.with_inline_graph(to_dict(g))
    return cfg.model_copy(update={"plan": plan.to_dict()})


def _layout(cfg, tp: int, engine: str):
    """Every unit on devices 0-1; the training unit at ``tp`` with ``engine`` (fsdp/auto)."""
    from rpeg.compile.sources import graph_from_config
    from rpeg.plan import colocated_plan

    g = graph_from_config(cfg)
    plan = colocated_plan(g, num_devices=2, tp=tp, micro_batch_size=cfg.workload.micro_batch_size)
    units = {
        k: (u.model_copy(update={"engine": engine}) if k.startswith("train") else u)
        for k, u in plan.units.items()
    }
    d = plan.model_copy(update={"units": units}).to_dict()
    d["graph"] = {"builder": None, "options": {}, "inline": None}  # the config's own graph
    return cfg.with_overrides({"cluster.num_devices": 2}).model_copy(update={"plan": d})


def _streamed(cfg, streaming: bool):
    """k=0, generation on worker 0 and training on worker 1, generate+reward fused: with
    ``streaming`` the trainer's log-prob passes run on each chunk while the next generates."""
    from rpeg.compile.sources import graph_from_config
    from rpeg.ir import fuse, to_dict
    from rpeg.plan import disaggregated_plan

    g = fuse(graph_from_config(cfg), ["generate", "reward"], streaming=streaming, name="rollout")
    plan = disaggregated_plan(
        g, gen_devices=1, train_devices=1, micro_batch_size=cfg.workload.micro_batch_size
    ).with_inline_graph(to_dict(g))
    return cfg.with_overrides({"cluster.num_devices": 2}).model_copy(
        update={"plan": plan.to_dict()}
    )


# The streaming pair's workload: streaming hands out prompt groups as their samples finish,
# so it can only gain where lengths vary. The default warm-up (150 supervised steps) leaves
# the tiny model answering in 2-3 tokens, every group ending at the same step; 5 steps leave
# 2-17 tokens (mean ~4), a long tail as RL responses have (tests/runtime/actors/
# test_dataplane.py uses the same).
STREAM_WORKLOAD = {"optim.warmup_sft_steps": 5, "workload.max_response_tokens": 32}


def _predicted_sync_s(cfg) -> float:
    """The performance model's weight-sync seconds for the config's compiled plan."""
    from rpeg.compile import resolve
    from rpeg.perf import Workload, predict_plan

    _, plan = resolve(None, cfg)
    pred = predict_plan(plan, Workload.from_config(cfg.workload), algorithm=cfg.algorithm)
    return float(sum(c.time_s for c in pred.stages.values() if "sync_weights" in c.kinds))


def _configs_main(a) -> dict:
    """Shipped configs as they are: single-process trainer vs Prefect + Dask, interleaved."""
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster

    from rpeg.config import RunConfig
    from rpeg.runtime.local_trainer import LocalTrainer

    tmp = tempfile.mkdtemp(prefix="rpeg-bench-")
    paths = [x for x in a.configs.split(",") if x]
    cfgs = {p: RunConfig.from_yaml(p).with_overrides({"runtime.steps": a.steps}) for p in paths}
    workers = max(c.cluster.n_workers or 2 for c in cfgs.values())
    times: dict[str, dict[str, list[float]]] = {p: {"local": [], "dask": []} for p in paths}
    lengths: dict[str, dict[str, list[float]]] = {p: {"local": [], "dask": []} for p in paths}
    t_all = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120), start_cluster(n_workers=workers) as cl:
        for r in range(a.rounds):
            for p in paths if r % 2 == 0 else reversed(paths):
                modes = ("local", "dask") if r % 2 == 0 else ("dask", "local")
                for mode in modes:
                    c = cfgs[p].with_overrides({"runtime.output_dir": f"{tmp}/{mode}{r}-{len(p)}"})
                    if mode == "local":
                        t = LocalTrainer(c)
                        hist = [t.step() for _ in range(a.steps)]
                    else:
                        hist = train_on(cl, c, progress=False)["_extra"]["history"]
                    times[p][mode] += [h["step_s"] for h in hist[1:]]  # step 0 left out
                    lengths[p][mode] += [h["response_length"] for h in hist[1:]]
    out = {"configs": {}, "load_avg": os.getloadavg(), "wall_s": time.perf_counter() - t_all}
    for p in paths:
        loc, dsk = (statistics.median(times[p][m]) for m in ("local", "dask"))
        tot_l, tot_d = (statistics.fmean(times[p][m]) for m in ("local", "dask"))
        out["configs"][p] = {
            "local_s": loc,
            "dask_s": dsk,
            "ratio": dsk / loc,
            "local_mean_s": tot_l,
            "dask_mean_s": tot_d,
            "total_ratio": tot_d / tot_l,
            "steps": times[p],
            # the same step of the same round on both runtimes (the same workload: below)
            "paired_median_ratio": statistics.median(
                d / max(x, 1e-9) for x, d in zip(times[p]["local"], times[p]["dask"], strict=True)
            ),
            # layout-invariant runs (docs/parallelism.md): the same responses step by step
            "same_response_length_steps": sum(
                abs(x - y) < 1e-9
                for x, y in zip(lengths[p]["local"], lengths[p]["dask"], strict=True)
            ),
        }
        print(
            f"CONFIG {p}: local {loc:.3f} s, prefect+dask {dsk:.3f} s per step (median), "
            f"ratio {dsk / loc:.2f}; mean {tot_l:.3f} vs {tot_d:.3f} s, total time ratio "
            f"{tot_d / tot_l:.2f}, step-by-step median ratio "
            f"{out['configs'][p]['paired_median_ratio']:.2f} ({len(times[p]['dask'])} steps each; "
            f"the same mean response length at {out['configs'][p]['same_response_length_steps']})"
        )
    print(
        "SUMMARY "
        + " ".join(
            f"{Path(p).stem}/local={v['ratio']:.2f} (total {v['total_ratio']:.2f})"
            for p, v in out["configs"].items()
        )
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved A/B rounds")
    ap.add_argument("--json", default=None)
    ap.add_argument("--layouts", default="ddp_dp2,fsdp_dp2,tp2", help="comma list; '' = none")
    ap.add_argument("--configs", default="", help="comma list of config files (see above)")
    ap.add_argument("--stream-prompts", type=int, default=16, help="prompts of the streaming pair")
    a = ap.parse_args(argv)
    if a.configs:
        return _configs_main(a)
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster

    from rpeg.runtime.local_trainer import LocalTrainer

    tmp = tempfile.mkdtemp(prefix="rpeg-bench-")
    samples: dict[str, list[float]] = {}
    overhead: list[float] = []
    ws_s: list[float] = []
    ws_bytes = 0.0
    rss: dict[str, list[int]] = {}
    predicted_sync = float("nan")

    def steps_of(hist):
        return [h["step_s"] for h in hist[1:]] or [h["step_s"] for h in hist]  # skip step 0

    def configs(r: int) -> dict:
        base = _cfg(f"{tmp}/sync{r}", a.steps, a.prompts, a.samples)
        lay = {
            "ddp_dp2": lambda c: _layout(c, 1, "auto"),
            "fsdp_dp2": lambda c: _layout(c, 1, "fsdp"),
            "tp2": lambda c: _layout(c, 2, "auto"),
        }
        extra = {
            n: lay[n](_cfg(f"{tmp}/{n}{r}", a.steps, a.prompts, a.samples))
            for n in a.layouts.split(",")
            if n
        }
        for n, on in (("k0_split_streaming", True), ("k0_split_no_streaming", False)):
            extra[n] = _streamed(
                _cfg(f"{tmp}/{n}{r}", a.steps, a.stream_prompts, a.samples, **STREAM_WORKLOAD),
                on,
            )
        return {
            **extra,
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
                s = train_on(cl, c, progress=False)
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
                    overhead += [
                        h["step_s"] - inside.get(int(h["step"]) - 1, 0.0) for h in hist[1:]
                    ]
                peak = s.get("peak_memory") or {}
                if peak:
                    rss[name] = [m.get("peak_rss_bytes", 0) for ms in peak.values() for m in ms]
                if name == "dask_async_k1":
                    predicted_sync = _predicted_sync_s(c)
                    ws = s["_extra"]["weight_sync"]
                    ws_s += [w["weight_sync_s"] for w in ws]
                    ws_bytes = ws[0]["weight_sync_bytes"] if ws else 0.0
    res = {k: statistics.median(v) for k, v in samples.items()}
    base = res["local"]
    # the streaming pair runs its own workload (STREAM_WORKLOAD): compared with each other only
    ratios = {k: res[k] / base for k in res if k != "local" and not k.startswith("k0_split")}
    res["overhead_per_step_s"] = res["dask_sync"] - base
    res["outside_actor_per_step_s"] = statistics.median(overhead) if overhead else float("nan")
    res["fused_over_unfused"] = res["dask_fused"] / res["dask_sync"]
    steps_per_s = {k: 1.0 / res[k] for k in samples if res[k] > 0}
    if ws_s:
        res["weight_sync_s"] = statistics.median(ws_s)
        res["weight_sync_bytes"] = ws_bytes
        res["weight_sync_predicted_s"] = predicted_sync
    out = {
        "median_step_s": res,
        "steps_per_s": steps_per_s,
        "peak_rss_mib_per_rank": {k: [round(b / 2**20) for b in v] for k, v in rss.items()},
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
        + (
            f" sync_measured={res['weight_sync_s']:.3f}s"
            f" sync_predicted={res['weight_sync_predicted_s']:.3f}s"
            if "weight_sync_s" in res
            else ""
        )
        + f" dask_sync/local={ratios['dask_sync']:.2f}"
    )
    if "k0_split_streaming" in res:
        print(
            f"STREAMING k=0 1+1 workers: streaming {res['k0_split_streaming']:.3f}s vs "
            f"without {res['k0_split_no_streaming']:.3f}s per step "
            f"({res['k0_split_streaming'] / res['k0_split_no_streaming']:.2f}x)"
        )
    for k in [n for n in a.layouts.split(",") if n]:
        if k in res:
            print(
                f"LAYOUT {k}: {steps_per_s[k]:.2f} steps/s, peak RSS per rank "
                f"{out['peak_rss_mib_per_rank'].get(k, [])} MiB"
            )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
    time.sleep(0)
