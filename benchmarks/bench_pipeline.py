"""Pipeline parallelism on CPU gloo ranks (rpeg.runtime.pipeline): one train step of the
built-in tiny model widened to ``--layers`` layers at pp=1 (one process) and at pp=2 under each
schedule; per rank the parameter bytes it holds, the step time, and the idle share of its
schedule measured from the recorded timeline (time not spent computing: waits on receives and
gaps) against the bubble the performance model assumes, ``(pp-1)/(v m + pp-1)``.

    python benchmarks/bench_pipeline.py [--layers 8] [--rows 16] [--micro 2] [--threads 1]
    python benchmarks/bench_pipeline.py --memory    # the 302M shape: peak per rank, 2 steps

Prints one line per run and a summary line. The step compares schedules on the same rows and
micro-batches; absolute times on a shared CPU are noisy (run it on an idle machine)."""

from __future__ import annotations

import argparse
import io
import json
import os
import time

import torch

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
#: the 302M-parameter built-in shape of benchmarks/bench_memory_scale.py
SHAPE_302M = {
    "hidden_size": 1536,
    "intermediate_size": 6144,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
}


def _config(micro: int, rows: int):
    from rpeg.config import RunConfig

    return RunConfig().with_overrides(
        {
            "algorithm.name": "grpo",
            "algorithm.kl_coef": 0.0,
            "workload.num_prompts": rows // 2,
            "workload.samples_per_prompt": 2,
            "workload.micro_batch_size": micro,
            "workload.train_minibatches": 1,
        }
    )


def _batch(rows: int, prompt: int = 16, response: int = 48):
    from rpeg.runtime.batch import RolloutBatch

    g = torch.Generator().manual_seed(0)
    return RolloutBatch(
        prompt_ids=torch.randint(3, 100, (rows, prompt), generator=g),
        prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
        response_ids=torch.randint(3, 100, (rows, response), generator=g),
        response_mask=torch.ones(rows, response, dtype=torch.long),
        sample_logprobs=torch.zeros(rows, response),
        policy_version=torch.zeros(rows, dtype=torch.long),
        group_ids=torch.arange(rows // 2).repeat_interleave(2),
        advantages=torch.randn(rows, response, generator=g),
    )


def _worker(args):
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.roles import PolicyWorker

    cfg = _config(args.micro, args.rows)
    shape = SHAPE_302M if args.memory else {"num_hidden_layers": args.layers}
    m, tok = create_tiny(seed=0, **shape)
    return PolicyWorker(
        m, tok, algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload, seed=0
    )


def _step(w, rows: int) -> tuple[float, dict]:
    b = _batch(rows)
    lp = w.compute_logprobs(b)
    b = b.replace(old_logprobs=lp, sample_logprobs=lp)
    w.train_step(b)  # warm-up (first-call allocations)
    t0 = time.perf_counter()
    metrics = w.train_step(b)
    return time.perf_counter() - t0, metrics


def _rank(rank: int, world: int, port: int, schedule: str, args, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime.pipeline import PipeLayout, apply_pipeline, new_groups

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(args.threads)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        lay = PipeLayout(pp=world, schedule=schedule)
        w = _worker(args)
        pipe = apply_pipeline(w, lay, rank, new_groups(lay, rank))
        b = _batch(args.rows)
        lp = w.compute_logprobs(b)
        b = b.replace(old_logprobs=lp, sample_logprobs=lp)
        w.train_step(b)
        pipe.timeline = []
        dist.barrier()
        t0 = time.perf_counter()
        w.train_step(b)
        dt = time.perf_counter() - t0
        tl = pipe.timeline
        start, end = min(x[3] for x in tl), max(x[4] for x in tl)
        busy = sum(x[4] - x[3] - x[5] for x in tl)
        res = {
            "step_s": dt,
            "param_bytes": sum(p.numel() * p.element_size() for p in w.lm.parameters()),
            "schedule_s": end - start,
            "idle": 1 - busy / (end - start),
            "micro": len({x[2] for x in tl}),
            "timeline": [(k, c, j, s - start, e - start, wt) for k, c, j, s, e, wt in tl],
        }
        buf = io.BytesIO()
        torch.save(res, buf)
        q.put((rank, buf.getvalue()))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported by the parent
        import traceback

        q.put((rank, traceback.format_exc().encode()))


def _peak_bytes() -> int:
    """This process's peak resident memory (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _memory_rank(rank: int, world: int, port: int, args, q) -> None:
    """Two train steps of the 302M shape at pp=``world`` (1: no pipeline): peak memory."""
    import torch.distributed as dist

    try:
        torch.set_num_threads(args.threads)
        w = _worker(args)
        if world > 1:
            from rpeg.runtime.pipeline import PipeLayout, apply_pipeline, new_groups

            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("gloo", rank=rank, world_size=world)
            lay = PipeLayout(pp=world, schedule="1f1b")
            apply_pipeline(w, lay, rank, new_groups(lay, rank))
        t0 = time.perf_counter()
        for _ in range(2):
            b = _batch(args.rows)
            lp = w.compute_logprobs(b)
            w.train_step(b.replace(old_logprobs=lp, sample_logprobs=lp))
        res = {
            "peak": _peak_bytes(),
            "params": sum(p.numel() * p.element_size() for p in w.lm.parameters()),
            "s": time.perf_counter() - t0,
        }
        q.put((rank, json.dumps(res).encode()))
        if world > 1:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported by the parent
        import traceback

        q.put((rank, traceback.format_exc().encode()))


def run_memory(args) -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = {}
    for world in (1, 2):
        q = ctx.Queue()
        procs = [
            ctx.Process(target=_memory_rank, args=(r, world, 29977, args, q)) for r in range(world)
        ]
        for p in procs:
            p.start()
        res = {}
        for _ in procs:
            r, raw = q.get(timeout=1800)
            try:
                res[r] = json.loads(raw)
            except ValueError:
                raise RuntimeError(raw.decode()) from None
        for p in procs:
            p.join()
        out[world] = res
        peaks = ", ".join(f"rank {r} {res[r]['peak'] / 1e9:.2f} GB" for r in sorted(res))
        params = ", ".join(f"{res[r]['params'] / 1e9:.2f}" for r in sorted(res))
        secs = max(res[r]["s"] for r in res)
        print(f"pp={world}: peak {peaks}; parameters {params} GB; 2 steps {secs:.1f} s")
    worst = max(v["peak"] for v in out[2].values())
    print(
        f"summary: 302M, 2 steps: pp=2 peak per rank {worst / 1e9:.2f} GB vs pp=1 "
        f"{out[1][0]['peak'] / 1e9:.2f} GB ({worst / out[1][0]['peak']:.2f}x)"
    )


def run_pp(schedule: str, args, port: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, schedule, args, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        r, res = q.get(timeout=600)
        try:
            out[r] = torch.load(io.BytesIO(res), weights_only=True)
        except Exception:  # noqa: BLE001
            raise RuntimeError(res.decode()) from None
    for p in procs:
        p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeline", help="write the 1f1b step's per-rank actions as JSON here")
    ap.add_argument("--memory", action="store_true", help="302M shape: peak memory per rank")
    args = ap.parse_args()
    if args.memory:
        return run_memory(args)
    from rpeg.runtime.pipeline import bubble_fraction

    torch.set_num_threads(args.threads)
    w = _worker(args)
    full = sum(p.numel() * p.element_size() for p in w.lm.parameters())
    t1, _ = _step(w, args.rows)
    m = -(-args.rows // args.micro)
    print(f"pp=1: step {t1:.3f} s, params {full / 2**20:.1f} MiB, {m} micro-batches")
    summary = [f"pp1 {t1:.2f}s"]
    for i, s in enumerate(SCHEDULES):
        res = run_pp(s, args, 29931 + 7 * i)
        if s == "1f1b" and args.timeline:
            import json

            with open(args.timeline, "w") as f:
                json.dump({r: res[r]["timeline"] for r in res}, f)
        idle = [res[r]["idle"] for r in (0, 1)]
        step = max(res[r]["step_s"] for r in res)
        print(
            f"pp=2 {s}: step {step:.3f} s; params rank0 {res[0]['param_bytes'] / 2**20:.1f} "
            f"MiB rank1 {res[1]['param_bytes'] / 2**20:.1f} MiB; measured idle share "
            f"rank0 {idle[0]:.2f} rank1 {idle[1]:.2f}; modelled bubble "
            f"{bubble_fraction(s, 2, m):.2f}"
        )
        summary.append(f"{s} {step:.2f}s idle {max(idle):.2f}/{bubble_fraction(s, 2, m):.2f}")
    print("summary: " + "; ".join(summary))


if __name__ == "__main__":
    main()
