"""The cost of one gloo collective call between two one-thread CPU ranks (the local-cpu
cluster's ``collective_latency_us``): ``all_reduce`` and ``all_gather`` of small tensors (the
per-layer key/value gathers of context parallelism, the per-tensor gradient sums of cp and of
pipelined dp replicas), one flattened ``all_reduce`` of the built-in model's gradients, and the
pair channel's exchange the tensor-parallel path uses instead (rpeg.runtime.parallel).
Mean, median and p90 per call: a sum of many calls pays the mean (gloo's worker threads come
back after a scheduler tick in some calls), so the mean is what the performance model prices.

    python benchmarks/bench_collectives.py [--repeats 400] [--threads 1]

Prints one line per case and a SUMMARY line."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def _stats(ts: list[float]) -> dict:
    ts = sorted(ts)
    return {
        "mean_ms": 1e3 * statistics.fmean(ts),
        "median_ms": 1e3 * statistics.median(ts),
        "p90_ms": 1e3 * ts[int(0.9 * (len(ts) - 1))],
    }


def _rank(rank: int, port: int, args, q) -> None:
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from transformers import LlamaForCausalLM

    from rpeg.runtime.model_io import tiny_config

    lm = LlamaForCausalLM(tiny_config())
    grads = [torch.randn_like(p) for p in lm.parameters()]
    kv = torch.randn(16, 4, 6, 64)  # [b, heads, positions / cp, head_dim] of rpeg-tiny
    out: dict[str, dict] = {}

    def timed(name: str, fn, n: int) -> None:
        for _ in range(10):
            fn()
        dist.barrier()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = _stats(ts)

    n = args.repeats
    timed("all_reduce 4 B", lambda: dist.all_reduce(torch.zeros(1)), n)
    timed(f"all_reduce {kv.numel() * 4 // 1024} KiB", lambda: dist.all_reduce(kv.clone()), n)
    parts = [torch.empty_like(kv) for _ in range(2)]
    timed(f"all_gather {kv.numel() * 4 // 1024} KiB", lambda: dist.all_gather(parts, kv), n)

    def per_tensor():
        for g in grads:
            dist.all_reduce(g)

    name = f"per-tensor all_reduce, {len(grads)} tensors (per call)"
    timed(name, per_tensor, max(20, n // 20))
    out[name] = {k: v / len(grads) for k, v in out[name].items()}
    flat = torch.cat([g.reshape(-1) for g in grads])
    timed(f"flat all_reduce {flat.numel() * 4 / 1e6:.1f} MB", lambda: dist.all_reduce(flat), 20)
    # inside a pass the ranks compute between calls (a decoder layer of rpeg-tiny at 16 rows:
    # ~1 ms): the call then also pays gloo's worker threads waking and the ranks' skew
    a = torch.randn(96, 256)
    wt = torch.randn(256, 1024)

    def layer_then(fn):
        def run():
            for _ in range(3):
                a @ wt
            fn()

        return run

    for nm, fn in (
        (
            f"all_gather {kv.numel() * 4 // 1024} KiB after compute",
            lambda: dist.all_gather(parts, kv),
        ),
        (
            f"all_reduce {kv.numel() * 4 // 1024} KiB after compute",
            lambda: dist.all_reduce(kv.clone()),
        ),
    ):
        timed(nm, layer_then(fn), n)
        timed("(the compute alone)", layer_then(lambda: None), n)
        out[nm] = {k: v - out["(the compute alone)"][k] for k, v in out[nm].items()}
    del out["(the compute alone)"]
    from rpeg.runtime.parallel import pair_exchange

    timed(
        f"pair exchange {kv.numel() * 4 // 1024} KiB",
        lambda: pair_exchange(kv, dist.group.WORLD),
        n,
    )
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the numbers here")
    # rpeg-tiny's gradients: 38 tensors, 16.9 MB (fp32)
    ap.add_argument("--grad-tensors", type=int, default=38, help=argparse.SUPPRESS)
    ap.add_argument("--grad-bytes", type=float, default=16.9e6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, args, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = q.get(timeout=600)
    for p in procs:
        p.join()
    for name, st in out.items():
        print(
            f"{name:42s} mean {st['mean_ms']:.3f} ms  median {st['median_ms']:.3f} ms  "
            f"p90 {st['p90_ms']:.3f} ms"
        )
    # the latency alpha of the model's formulas (rpeg.perf.costs at p = 2: an all-gather
    # alpha + n / 2 / bw, an all-reduce 2 alpha + n / bw) that the calls a pass makes pay:
    # after compute (cp's key/value gathers and sums) and back to back (the per-tensor
    # gradient sums), bytes at the catalog's local-cpu bandwidth
    from rpeg import specs

    bw = specs.cluster("local-cpu").intra_gbps * 1e9
    kvb = 16 * 4 * 6 * 64 * 4
    per_tensor = [v for k, v in out.items() if k.startswith("per-tensor")][0]["mean_ms"] / 1e3
    grad_bytes = float(args.grad_bytes) / float(args.grad_tensors)
    fits = {
        "all_gather after compute": out[
            [k for k in out if k.startswith("all_gather") and "after" in k][0]
        ]["mean_ms"]
        / 1e3
        - kvb / 2 / bw,
        "all_reduce after compute": (
            out[[k for k in out if k.startswith("all_reduce") and "after" in k][0]]["mean_ms"] / 1e3
            - kvb / bw
        )
        / 2,
        "per-tensor all_reduce": (per_tensor - grad_bytes / bw) / 2,
    }
    for k, v in fits.items():
        print(f"alpha from {k:30s} {1e3 * v:.3f} ms")
    print(
        f"SUMMARY gloo collective latency alpha (2 ranks, calls inside a pass): "
        f"{1e3 * statistics.fmean(fits.values()):.3f} ms (clusters.yaml local-cpu "
        "runtime.collective_latency_ms; this machine's: rpeg calibrate RUN --collective-ms "
        f"{1e3 * statistics.fmean(fits.values()):.3f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
