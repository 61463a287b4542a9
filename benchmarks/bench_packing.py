"""What sequence packing saves (docs/packing.md): one optimizer step's log-prob and training
passes of a policy over RL-shaped rows -- ragged responses with a long tail to the cap --
run padded (``micro_batch_size`` rows each, padded to their longest) and packed (the same
rows end to end in a ``micro_batch_size x max_seq`` token budget), interleaved, on one
thread. Prints the tokens each computes, the median times of ``--repeats`` rounds, and a
SUMMARY line.

    python benchmarks/bench_packing.py [--rows 64] [--mbs 8] [--mean 48] [--cap 256]
        [--prompt 24] [--sigma 0.8] [--hidden 256] [--layers 4] [--repeats 5]

Lengths are lognormal (mean ``--mean``, spread ``--sigma``) cut at the cap, drawn with seed 0."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Cut:
    micro_batch_size: int
    max_tokens_per_micro_batch: int | None = None
    seq_packing: bool = False


def _batch(args):
    from rpeg.runtime.batch import RolloutBatch

    g = torch.Generator().manual_seed(0)
    mu = torch.log(torch.tensor(float(args.mean))) - args.sigma**2 / 2
    r = torch.exp(mu + args.sigma * torch.randn(args.rows, generator=g)).round().clamp(1, args.cap)
    p = torch.randint(args.prompt // 2, args.prompt + 1, (args.rows,), generator=g)
    pw, rw = int(p.max()), int(r.max())
    pmask = (torch.arange(pw)[None] >= pw - p[:, None]).long()
    rmask = (torch.arange(rw)[None] < r[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.randint(5, 95, (args.rows, pw), generator=g) * pmask,
        prompt_mask=pmask,
        response_ids=torch.randint(5, 95, (args.rows, rw), generator=g) * rmask,
        response_mask=rmask,
        sample_logprobs=torch.zeros(args.rows, rw),
        policy_version=torch.zeros(args.rows, dtype=torch.long),
        group_ids=torch.arange(args.rows),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, default in (
        ("rows", 64),
        ("mbs", 8),
        ("mean", 48),
        ("cap", 256),
        ("prompt", 24),
        ("hidden", 256),
        ("layers", 4),
        ("repeats", 5),
    ):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--sigma", type=float, default=0.8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from types import SimpleNamespace

    from rpeg.runtime.micro_batches import micro_batches
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.roles import PolicyWorker

    model, _ = create_tiny(
        seed=0,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        max_position_embeddings=args.prompt + args.cap + 8,
    )
    w = PolicyWorker(model, SimpleNamespace(pad_token_id=0, eos_token_id=99))
    batch = _batch(args)
    max_seq = args.prompt + args.cap
    cuts = {
        "padded": Cut(args.mbs),
        "packed": Cut(args.mbs, args.mbs * max_seq, seq_packing=True),
    }
    real = int(batch.attention_mask.sum())
    for name, cut in cuts.items():
        w.micro_batching = cut
        parts = micro_batches(batch, w)
        computed = sum(
            int(mb.attention_mask.sum()) if cut.seq_packing else mb.input_ids.numel()
            for _, mb, _ in parts
        )
        print(f"{name}: {len(parts)} micro-batches, {computed} tokens computed ({real} real)")
    times: dict[str, dict[str, list[float]]] = {n: {"fwd": [], "train": []} for n in cuts}
    for _ in range(args.repeats):
        for name, cut in cuts.items():
            w.micro_batching = cut
            t = time.perf_counter()
            w.compute_logprobs(batch)
            times[name]["fwd"].append(time.perf_counter() - t)
            w.lm.train()
            t = time.perf_counter()
            for _, mb, _ in micro_batches(batch, w):
                lp, _, _ = w._forward(mb, 1.0)
                (lp * mb.response_mask).sum().backward()
            times[name]["train"].append(time.perf_counter() - t)
            w.lm.zero_grad()
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in times.items()}
    for n, d in med.items():
        print(f"{n}: forward {d['fwd']:.3f} s, forward+backward {d['train']:.3f} s (median)")
    fwd = med["padded"]["fwd"] / med["packed"]["fwd"]
    train = med["padded"]["train"] / med["packed"]["train"]
    print(
        f"SUMMARY rows={args.rows} mbs={args.mbs} mean={args.mean} cap={args.cap} "
        f"sigma={args.sigma} padded/packed forward={fwd:.2f}x train={train:.2f}x"
    )


if __name__ == "__main__":
    main()
