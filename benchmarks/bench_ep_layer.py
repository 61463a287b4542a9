"""What one MoE layer's expert-parallel dispatch costs on this machine's CPU ranks, beyond
the local experts' own compute: the routing's host work (sort, counts, index) and the four
all-to-alls of rpeg.runtime.expert_parallel (counts, expert ids, hidden states, results),
waits for the other rank included. Two gloo ranks, one thread each, build the tiny Qwen3-MoE
of tests/runtime/models/test_moe.py (LEARNER: 4 MoE layers of 8 experts, top-2, h 256) at
fsdp dp=2 x ep=2 and run forwards (no grad) of one sequence per rank whose lengths differ
per rank and per call (as an RL batch's rows do), then forward + backward. Prints per MoE
layer and call: the dispatch's time outside the experts, the all-to-alls' share, and a summary
line. The figure is the CPU device's ``ep_layer_overhead_ms`` (rpeg/specs/data/gpus.yaml).

    python benchmarks/bench_ep_layer.py [--calls 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rank(rank: int, world: int, port: int, calls: int, q) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from rpeg.runtime import expert_parallel as EP
    from rpeg.runtime.mesh import Layout
    from tests.runtime.models import ranks
    from tests.runtime.models.test_moe import LEARNER

    base = ranks.model
    ranks.model = lambda mt, **o: base(mt, **{**LEARNER, **o})
    w = ranks.ep_policy("qwen3_moe", Layout(dp=2, ep=2, fsdp=True), meta=True)
    lm = w.module
    acc = {"in": 0.0, "experts": 0.0, "a2a": 0.0, "calls": 0}
    real_a2a = dist.all_to_all_single

    def a2a(*a, **k):
        t = time.perf_counter()
        out = real_a2a(*a, **k)
        acc["a2a"] += time.perf_counter() - t
        return out

    for m in lm.modules():
        info = getattr(m, EP.EP_ATTR, None)
        if info is None:
            continue
        inner = info["forward"]

        def experts(self, *a, _inner=inner, **k):
            t = time.perf_counter()
            out = _inner(self, *a, **k)
            acc["experts"] += time.perf_counter() - t
            return out

        info["forward"] = experts
        cls = type(m)
        if not getattr(cls, "_bench_wrapped", False):
            outer = cls.forward

            def timed(self, *a, _outer=outer, **k):
                t = time.perf_counter()
                out = _outer(self, *a, **k)
                acc["in"] += time.perf_counter() - t
                acc["calls"] += 1
                return out

            cls.forward, cls._bench_wrapped = timed, True
    dist.all_to_all_single = a2a
    g = torch.Generator().manual_seed(rank)

    def ids():
        n = int(torch.randint(12, 40, (1,), generator=g))
        return torch.randint(3, 90, (1, n), generator=g)

    out = {}
    for mode in ("forward", "forward+backward"):
        for _ in range(5):
            lm(input_ids=ids())
        dist.barrier()
        acc.update({"in": 0.0, "experts": 0.0, "a2a": 0.0, "calls": 0})
        for _ in range(calls):
            if mode == "forward":
                with torch.no_grad():
                    lm(input_ids=ids())
            else:
                lm(input_ids=ids()).logits.float().mean().backward()
        n = acc["calls"]
        out[mode] = {
            "dispatch_ms": (acc["in"] - acc["experts"]) / n * 1e3,
            "a2a_ms": acc["a2a"] / n * 1e3,
            "experts_ms": acc["experts"] / n * 1e3,
        }
    q.put((rank, out))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = 29000 + os.getpid() % 1000
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args.calls, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    for mode in ("forward", "forward+backward"):
        for r in (0, 1):
            d = res[r][mode]
            print(
                f"{mode:17s} rank {r}: per MoE layer and call: dispatch outside the experts "
                f"{d['dispatch_ms']:.2f} ms (all-to-alls {d['a2a_ms']:.2f} ms), "
                f"local experts {d['experts_ms']:.2f} ms"
            )
    fwd = statistics.mean(res[r]["forward"]["dispatch_ms"] for r in (0, 1))
    both = statistics.mean(res[r]["forward+backward"]["dispatch_ms"] for r in (0, 1))
    print(
        f"summary: ep=2 dispatch per MoE layer: forward {fwd:.2f} ms, in a training forward {both:.2f} ms"
    )


if __name__ == "__main__":
    main()
