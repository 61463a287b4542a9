"""A family no shipped row checks, priced from what a user would write: NeMo-Aligner's PPO with
TensorRT-LLM generation (NVIDIA/NeMo-Aligner docs/user-guide/rlhf.rst @ af2b3bd9, "PPO
Performance Results with TensorRT-LLM"): a Llama3-70B actor and a Llama3-70B reward model /
critic on 8+4 ... 64+32 nodes of 8 H100s, 1,024 rollout samples, global batch 128, mean
generated tokens published per run; and a Llama3.1-405B actor and reward model on 84+42 nodes,
128 samples. The actor's nodes generate and train; the critic / reward-model server runs on its
own nodes (the two node counts), KL penalty on (a reference).

Each run becomes one shared-schema row (model, GPUs, system, batch, lengths and the table's
words in ``notes``; layouts and recipe columns blank) and is scored leave-one-source-out as
``rpeg validate FILE`` scores a user's file (the shipped sets join the fit). Prints each row's
prediction and what it solved, then a summary line.
``python benchmarks/unseen_family_aligner.py`` (~10 s). docs/validation.md, "A family no row checks".
"""

from __future__ import annotations

from user_file import blank_row, print_scored, score, summary

# (model, actor nodes, critic nodes, rollout samples, mean generated tokens, step s)
#: model, actor nodes, critic nodes, samples, mean generated tokens, step s, what the docs add
TABLE = (
    ("llama3-70b", 8, 4, 1024, 350.7, 366.7, "reshard enabled"),
    ("llama3-70b", 16, 8, 1024, 323.3, 190.4, "reshard enabled"),
    ("llama3-70b", 32, 16, 1024, 331.7, 108.0, "reshard enabled"),
    # the table's note: this run's rollout_micro_batch_size was 16, not 8
    ("llama3-70b", 64, 32, 1024, 334.0, 56.9, "reshard enabled; rollout_micro_batch_size of 16"),
    ("llama3.1-405b", 84, 42, 128, 915.6, 164.6, "reshard turned off"),
)


def rows() -> list[dict[str, str]]:
    out = []
    for model, actor, critic, samples, gen, step, said in TABLE:
        r = blank_row(
            case_id=f"aligner-{model}-{actor}x{critic}",
            source="NeMo-Aligner docs PPO TensorRT-LLM",
            measured_by="NVIDIA NeMo-Aligner team",
            algorithm="ppo",
            model=model,
            gpu="h100",
            num_gpus=str(8 * (actor + critic)),
            gpus_per_node="8",
            train_backend="megatron",
            num_prompts=str(samples),
            samples_per_prompt="1",
            train_minibatches=str(samples // 128),
            avg_gen_len=str(gen),
            has_critic="yes",
            has_ref="yes",
            measured_step_s=str(step),
            notes=(
                f"NeMo-Aligner PPO with TensorRT-LLM generation (trt_llm.enable), {said}; actor "
                f"on {actor} nodes, critic and reward model server on {critic} nodes; "
                f"num_rollout_samples={samples}, global_batch_size=128; reward model"
            ),
        )
        out.append(r)
    return out


def main() -> None:
    out = score(rows(), "aligner")
    print_scored(out, 28)
    print(summary(out))


if __name__ == "__main__":
    main()
