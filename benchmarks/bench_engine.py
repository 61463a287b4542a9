"""Generation and training throughput of the RPEG torch engine on the built-in tiny model,
next to transformers' ``model.generate`` on the same batch.

    python benchmarks/bench_engine.py [--batch 64] [--new-tokens 32] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch


def _best(fn, repeats):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from rpeg.config import RunConfig
    from rpeg.runtime import stages
    from rpeg.runtime.data import ArithmeticSource
    from rpeg.runtime.engines import SamplingParams
    from rpeg.runtime.model_io import count_params, create_tiny
    from rpeg.runtime.rewards import RewardSet
    from rpeg.runtime.roles import PolicyWorker

    model, tok = create_tiny(seed=0)
    model.eval()
    cfg = RunConfig().with_overrides(
        {
            "workload.num_prompts": args.batch,
            "workload.samples_per_prompt": 1,
            "workload.max_response_tokens": args.new_tokens,
            "workload.train_minibatches": 1,
            "workload.micro_batch_size": args.batch,
        }
    )
    worker = PolicyWorker(
        model, tok, algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload
    )
    exs = [ArithmeticSource(2)[i] for i in range(args.batch)]
    prompt_ids = worker.encode_prompts([e.question for e in exs])
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)

    # --- our engine ------------------------------------------------------------------------
    t_ours, out = _best(lambda: worker.generate(prompt_ids, params, seed=0), args.repeats)
    ours_tok = int(out.lengths.sum())

    # --- transformers generate on the same (left-padded) batch ---------------------------------
    enc = tok.pad({"input_ids": prompt_ids}, padding=True, return_tensors="pt")

    def hf():
        with torch.no_grad():
            return model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )

    t_hf, hf_out = _best(hf, args.repeats)
    gen = hf_out[:, enc["input_ids"].shape[1] :]
    hf_tok = 0
    for row in gen.tolist():
        n = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        hf_tok += n

    # --- training throughput (one GRPO train step over the rollout batch) ----------------------
    batch, _ = stages.generate_stage(worker, exs, 1, params=params, seed=0)
    batch, _ = stages.reward_stage(batch, RewardSet(["exact_numeric"]))
    batch = batch.replace(rewards=torch.randn(batch.size))
    batch, _ = stages.behaviour_as_old(batch)
    batch, _ = stages.advantage_stage(
        batch, cfg.algorithm.model_copy(update={"name": "reinforce_pp"}), 1
    )
    t_train, _ = _best(lambda: worker.train_step(batch), args.repeats)
    train_tok = batch.num_tokens
    t_fwd, _ = _best(lambda: worker.compute_logprobs(batch), args.repeats)

    res = {
        "params": count_params(model),
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "ours_gen_tokens_per_s": ours_tok / t_ours,
        "hf_generate_tokens_per_s": hf_tok / t_hf,
        "train_tokens_per_s": train_tok / t_train,
        "forward_tokens_per_s": train_tok / t_fwd,
    }
    print(
        f"rpeg-tiny: {res['params'] / 1e6:.2f}M params, batch {args.batch}, {args.new_tokens} new tokens, {args.threads} thread(s)"
    )
    print(
        f"  generation  rpeg TorchEngine : {res['ours_gen_tokens_per_s']:9.0f} tok/s  ({ours_tok} tokens in {t_ours:.3f}s)"
    )
    print(
        f"  generation  HF model.generate: {res['hf_generate_tokens_per_s']:9.0f} tok/s  ({hf_tok} tokens in {t_hf:.3f}s)"
    )
    print(
        f"  training    fwd+bwd+AdamW    : {res['train_tokens_per_s']:9.0f} tok/s  ({train_tok} tokens in {t_train:.3f}s)"
    )
    print(f"  log-probs   forward only     : {res['forward_tokens_per_s']:9.0f} tok/s")
    print(
        f"summary: engine {res['ours_gen_tokens_per_s']:.0f} tok/s vs HF generate {res['hf_generate_tokens_per_s']:.0f} tok/s "
        f"({res['ours_gen_tokens_per_s'] / res['hf_generate_tokens_per_s']:.2f}x); train {res['train_tokens_per_s']:.0f} tok/s"
    )
    return res


if __name__ == "__main__":
    main()
