"""Context parallelism on CPU gloo ranks (rpeg.runtime.context_parallel): one GRPO train step
on responses of ``--response`` tokens (the built-in tiny model, max positions raised) at cp=1
and cp=2, both through the context-parallel path (the same attention code); per rank the
activation memory -- the bytes of the distinct tensors autograd saves for backward during the
step (``saved_tensors_hooks``; parameters left out), per micro-batch -- and the time. (Resident
memory is no measure here: the allocator keeps a warm-up's freed pages.)

    python benchmarks/bench_context.py [--response 4096] [--prompt 16] [--rows 2] [--threads 1]

Prints one line per layout and a summary line."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _batch(rows: int, prompt: int, response: int):
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


def _rank(rank: int, world: int, port: int, args, q) -> None:
    import torch.distributed as dist

    try:
        from rpeg.config import RunConfig
        from rpeg.runtime.context_parallel import apply_context_parallel
        from rpeg.runtime.model_io import create_tiny
        from rpeg.runtime.roles import PolicyWorker

        torch.set_num_threads(args.threads)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        cfg = RunConfig().with_overrides(
            {
                "algorithm.name": "grpo",
                "algorithm.kl_coef": 0.0,
                "workload.num_prompts": args.rows // 2,
                "workload.samples_per_prompt": 2,
                "workload.micro_batch_size": 1,
                "workload.train_minibatches": 1,
            }
        )
        m, tok = create_tiny(seed=0, max_position_embeddings=args.prompt + args.response + 8)
        w = PolicyWorker(m, tok, algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload)
        apply_context_parallel(w, dist.group.WORLD, rank, world)
        b = _batch(args.rows, args.prompt, args.response)
        lp = w.compute_logprobs(b)
        b = b.replace(old_logprobs=lp, sample_logprobs=lp)
        w.train_step(b)  # warm-up: optimizer state exists before the measured step
        params = {p.untyped_storage().data_ptr() for p in w.lm.parameters()}
        saved: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                saved[st.data_ptr()] = st.nbytes()
            return t

        dist.barrier()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            metrics = w.train_step(b)
        res = {
            "s": time.perf_counter() - t0,
            "transient": sum(saved.values()) / args.rows,  # one row per micro-batch
            "pg_loss": metrics["pg_loss"],
        }
        q.put((rank, json.dumps(res)))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported by the parent
        import traceback

        q.put((rank, traceback.format_exc()))


def run(world: int, args, port: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        r, raw = q.get(timeout=1800)
        try:
            out[r] = json.loads(raw)
        except ValueError:
            raise RuntimeError(raw) from None
    for p in procs:
        p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--response", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    res = {}
    for i, cp in enumerate((1, 2)):
        out = run(cp, args, 29961 + 5 * i)
        res[cp] = out
        mem = ", ".join(f"rank {r} {out[r]['transient'] / 2**30:.2f} GiB" for r in sorted(out))
        step = max(o["s"] for o in out.values())
        print(
            f"cp={cp}: activations per micro-batch {mem}; step {step:.1f} s; "
            f"pg_loss {out[0]['pg_loss']:.6f}"
        )
    one = res[1][0]["transient"]
    two = max(o["transient"] for o in res[2].values())
    print(
        f"summary: {args.response}-token responses, activations per micro-batch per rank cp=2 "
        f"{two / 2**30:.2f} GiB vs cp=1 {one / 2**30:.2f} GiB ({two / one:.2f}x)"
    )


if __name__ == "__main__":
    main()
