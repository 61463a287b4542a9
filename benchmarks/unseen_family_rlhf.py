"""A family no shipped row checks, priced from what a user would write: the OpenRLHF README's
"Performance" table (OpenRLHF/OpenRLHF README.md @ c1fc63a9, "The average time (seconds) it
took to train 1024 prompts with 1 PPO epoch", A800-80GB): Llama-2 7B / 13B / CodeLlama-34B /
Llama-2 70B PPO with a critic, a learned reward model and a KL reference, on 16 / 32 / 32 / 32
GPUs, OpenRLHF against "Optimized DSChat (with Hybrid Engine)" (Adam, reward-model and
reference offload), prompt and response caps 1,024 tokens.

Each run becomes one shared-schema row (model, GPUs, system, batch, caps and the table's
words in ``notes``; layouts, lengths and recipe columns blank) and is scored leave-one-source-
out as ``rpeg validate FILE`` scores a user's file (the shipped sets join the fit). Prints each
row's prediction and the solved/assumed inputs, then a summary line.
``python benchmarks/unseen_family_rlhf.py`` (~12 s). docs/validation.md, "A family no row checks".
"""

from __future__ import annotations

from user_file import blank_row, print_scored, score, summary

# (size tag, catalog model, A800 GPUs, Optimized DSChat s, OpenRLHF s): the README's table
TABLE = (
    ("7b", "llama2-7b", 16, 855.09, 471.11),
    ("13b", "llama2-13b", 32, 1528.93, 608.93),
    ("34b", "codellama-34b", 32, 3634.98, 1526.4),
    ("70b", "llama2-70b", 32, 10407.0, 4488.53),
)
SYSTEMS = {
    "openrlhf": ("deepspeed zero-3", "OpenRLHF (Ray + vLLM + DeepSpeed)"),
    "dschat": (
        "deepspeed-chat hybrid engine",
        "Optimized DeepSpeed-Chat with Hybrid Engine, Adam offload",
    ),
}


def rows() -> list[dict[str, str]]:
    out = []
    for tag, model, gpus, dschat_s, openrlhf_s in TABLE:
        for name, step in (("openrlhf", openrlhf_s), ("dschat", dschat_s)):
            backend, words = SYSTEMS[name]
            r = blank_row(
                case_id=f"{name}-{tag}",
                source="OpenRLHF README Performance",
                measured_by="OpenRLHF authors",
                algorithm="ppo",
                model=model,
                gpu="a800",
                num_gpus=str(gpus),
                gpus_per_node="8",
                train_backend=backend,
                num_prompts="1024",
                samples_per_prompt="1",
                max_gen_len="1024",
                max_seq_len="2048",
                has_critic="yes",
                has_ref="yes",
                measured_step_s=str(step),
                notes=f"{words}; average time to train 1024 prompts with 1 PPO epoch; "
                "prompt_max_len 1024, generate_max_len 1024; reward model",
            )
            out.append(r)
    return out


def main() -> None:
    out = score(rows(), "openrlhf_readme")
    errs = print_scored(out, 14)
    by = " ".join(f"{k}={sum(v) / len(v):.1f}%" for k, v in sorted(errs.items()))
    print(f"{summary(out)} {by}")


if __name__ == "__main__":
    main()
