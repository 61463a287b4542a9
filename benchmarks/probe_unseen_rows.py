"""Random shared-schema rows of runs nobody published: does ``rpeg validate`` price every row a
real system could run, and name why it refuses the others?

Each row takes a catalog model, a catalog GPU, a family (verl FSDP/Megatron, NeMo-RL, OpenRLHF,
DeepSpeed-Chat, AReaL, slime, TRL, NeMo-Aligner or none), colocated or disaggregated placement, a batch and a
response cap; only the shared schema's columns (layouts, lengths, recipe columns blank). GPUs:
the smallest power of two holding >= 20 bytes per parameter (the training state), times 1-8.
Prints each refusal and a summary line. ``python benchmarks/probe_unseen_rows.py --rows 600``.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from rpeg import specs
from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows, validate_rows

FAMILIES = [
    ("verl", "fsdp"),
    ("verl", "megatron"),
    ("NeMo-RL", ""),
    ("NeMo-RL", "megatron"),
    ("OpenRLHF", "deepspeed"),
    ("DeepSpeed-Chat", "deepspeed zero-3"),
    ("AReaL", ""),
    ("slime", "megatron"),
    ("TRL", ""),
    ("NeMo-Aligner", ""),
    ("", ""),
]


def rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    header = list(read_rows(loso.shared_copies()["steps_dev (shared schema)"])[0])
    models = {k: v for k, v in specs.models().items() if k != "rpeg-tiny"}
    gpus = {k: v for k, v in specs.gpus().items() if k != "cpu"}
    out = []
    for i in range(n):
        name = rng.choice(sorted(models))
        gpu = rng.choice(sorted(gpus))
        gpus_n = 1
        while gpus_n * gpus[gpu].hbm_gb * 1e9 < 20 * models[name].params:
            gpus_n *= 2
        gpus_n *= rng.choice([1, 1, 2, 4, 8])
        if gpus_n > 1024:
            continue
        family, backend = rng.choice(FAMILIES)
        placement = rng.choice(["colocated", "colocated", "disaggregated"])
        r = dict.fromkeys(header, "")
        r.update(
            case_id=f"probe-{i}", source=f"{family or 'a paper'} probe {i}",
            algorithm=rng.choice(["GRPO", "PPO", "DAPO"]), model=name, gpu=gpu,
            num_gpus=str(gpus_n), placement=placement, train_backend=backend,
            num_prompts=str(rng.choice([32, 64, 128, 256, 512])),
            samples_per_prompt=str(rng.choice([1, 4, 8, 16])),
            max_gen_len=str(rng.choice([1024, 4096, 8192, 16384, 32768])),
            measured_step_s="100", has_critic=rng.choice(["", "no", "yes"]),
            notes=f"{family} run",
        )  # fmt: skip
        if placement == "disaggregated" and gpus_n >= 2:
            r.update(gen_gpus=str(gpus_n // 2), train_gpus=str(gpus_n - gpus_n // 2))
        if rng.random() < 0.3:
            r["staleness"] = str(rng.choice([0, 1, 2]))
        out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    probe = rows(a.rows, a.seed)
    report = validate_rows(probe, intervals=True)
    by_id = {r["case_id"]: r for r in probe}
    why: Counter[str] = Counter()
    for res in report.rows:
        if res.predicted_step_s is not None:
            continue
        r = by_id[res.case_id]
        kind = res.reason.split(":")[0]
        why[kind] += 1
        print(
            f"{res.case_id:10s} {r['model']:30s} {r['gpu']:14s} x{r['num_gpus']:>4s} "
            f"{r['placement']:13s} cap {r['max_gen_len']:>5s} | {res.reason[:160]}"
        )
    priced = len(probe) - sum(why.values())
    print(
        f"SUMMARY rows={len(probe)} priced={priced} refused={sum(why.values())} "
        + " ".join(f"[{k}]={v}" for k, v in why.most_common())
    )


if __name__ == "__main__":
    main()
