"""A vision-language trainer no shipped row checks, priced from what a user would write:
EasyR1's "Performance Baselines" (hiyouga/EasyR1 assets/baselines.md; v0.3.0 table @ fb24593,
2025-04-23, and v0.3.2 table @ 8460e81, 2025-09-18): Qwen2.5-VL-3B / 7B / 32B-Instruct GRPO on
Geometry3k, one node of 8 H100 80GB (or 8 L20 48GB), "Sec per step" and tokens/s/GPU.

EasyR1 is a fork of verl (FSDP actor, vLLM rollout in the same process, colocated). What its
tables leave to the defaults is read from its examples/config.yaml of each version (512 prompts
x 5 samples, 2,048-token prompt and response caps, actor global batch 128 = 4 updates a step,
KL loss against a reference, vLLM at 0.6 of memory, min_pixels 262,144 = 334 image tokens of
Qwen2.5-VL); each run becomes one shared-schema row (model, GPUs, system, batch, caps, vLLM
TP and the table's words in ``notes``; response lengths and the remaining layout blank) and is
scored leave-one-source-out as ``rpeg validate FILE`` scores a user's file (the shipped sets
join the fit). Prints each row's prediction, then a summary line.
``python benchmarks/unseen_family_vl.py`` (~10 s). docs/validation.md, "A family no row checks".
"""

from __future__ import annotations

from user_file import blank_row, print_scored, score, summary

#: (version, size, GPU, bits, micro-batch update / experience, vLLM TP, tokens/s/GPU, s/step)
TABLE = (
    ("v0.3.0", "3B", "H100", "AMP", "4 / 16", 2, 1200, 180),
    ("v0.3.0", "7B", "H100", "AMP", "4 / 16", 2, 1200, 180),
    ("v0.3.0", "7B", "H100", "AMP", "10 / 20", 2, 1400, 170),
    ("v0.3.0", "7B", "L20", "AMP", "4 / 16", 2, 410, 580),
    ("v0.3.0", "7B", "H100", "BF16", "4 / 16", 2, 1280, 190),
    ("v0.3.0", "32B", "H100", "BF16", "1 / 8", 8, 360, 860),
    ("v0.3.2", "3B", "H100", "AMP", "1 / 2", 2, 1800, 120),
    ("v0.3.2", "7B", "H100", "AMP", "1 / 2", 2, 1600, 145),
    ("v0.3.2", "7B", "H100", "AMP", "4 / 8", 2, 2000, 120),
    ("v0.3.2", "7B", "L20", "AMP", "1 / 2", 2, 410, 580),
    ("v0.3.2", "7B", "H100", "BF16", "1 / 2", 2, 1600, 145),
    ("v0.3.2", "32B", "H100", "BF16", "1 / 2", 8, 620, 530),
)


def rows() -> list[dict[str, str]]:
    out = []
    for i, (version, size, gpu, bits, micro, tp, tput, step) in enumerate(TABLE):
        r = blank_row(
            case_id=f"easyr1-{version}-{size.lower()}-{gpu.lower()}-{bits.lower()}-{i}",
            source=f"EasyR1 baselines {version}",
            measured_by="EasyR1 authors",
            algorithm="grpo",
            model=f"Qwen/Qwen2.5-VL-{size}-Instruct",
            gpu=gpu,
            num_gpus="8",
            gpus_per_node="8",
            placement="colocated",
            gen_tp=str(tp),
            train_backend="fsdp",
            precision="bf16" if bits == "BF16" else "amp",
            num_prompts="512",
            samples_per_prompt="5",
            train_minibatches="4",
            max_gen_len="2048",
            max_seq_len="4096",
            has_ref="yes",
            has_critic="no",
            measured_step_s=str(step),
            measured_other=f"tokens_per_s_per_gpu={tput}",
            notes=(
                f"EasyR1 {version} GRPO on Geometry3k, Qwen2.5-VL; micro batch "
                f"size per device for update / experience {micro}; vLLM gpu_memory_utilization "
                "0.6, tensor_parallel_size as the table; KL loss; min_pixels 262144; "
                "rollout_batch_size 512, n 5, global_batch_size 128"
            ),
        )
        out.append(r)
    return out


def main() -> None:
    out = score(rows(), "easyr1")
    print_scored(out, 34)
    print(summary(out))


if __name__ == "__main__":
    main()
