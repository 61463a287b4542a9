"""Config keys of verl and TRL, and the run-config field that holds the same setting.

A user coming from verl writes ``data.train_files=...`` or ``trainer.total_training_steps=5``;
one coming from TRL's ``GRPOConfig`` writes ``num_generations: 8``. Those keys are unknown
to :class:`rpeg.config.RunConfig` and are refused like any unknown field, but the refusal
names the field that holds the setting here (``data.train_files: unknown field: verl's
setting; RPEG's field is task.url``), so the first config is translated by reading the errors.

Only keys whose meaning carries over are listed, each with the RPEG field and, where the
value does not transfer as written, how to derive it (``ppo_mini_batch_size`` is a count of
prompts per update; RPEG counts updates per step). Sources: verl's
``verl/trainer/config/ppo_trainer.yaml`` (v0.5-v0.6) and TRL's ``GRPOConfig`` (0.2x).
"""

from __future__ import annotations

from typing import Any

#: verl dotted key -> (RPEG field, how the value carries over or "" when it is the same)
VERL_KEYS: dict[str, tuple[str, str]] = {
    "data.train_files": (
        "task.url",
        "one file or datasets folder; task.kind: jsonl, parquet or hf",
    ),
    "data.val_files": ("task.val_url", ""),
    "data.prompt_key": ("task.prompt_key", ""),
    "data.max_prompt_length": ("workload.max_prompt_tokens", ""),
    "data.max_response_length": ("workload.max_response_tokens", ""),
    "data.train_batch_size": ("workload.num_prompts", "prompts per step"),
    "data.filter_overlong_prompts": ("task.overlong", "true = filter"),
    "data.truncation": ("task.overlong", "error = error, left = truncate"),
    "actor_rollout_ref.model.path": ("model.path", ""),
    "actor_rollout_ref.model.lora_rank": ("model.lora.rank", ""),
    "actor_rollout_ref.model.lora_alpha": ("model.lora.alpha", ""),
    "actor_rollout_ref.model.target_modules": ("model.lora.target_modules", ""),
    "actor_rollout_ref.actor.optim.lr": ("optim.lr", ""),
    "actor_rollout_ref.actor.optim.weight_decay": ("optim.weight_decay", ""),
    "actor_rollout_ref.actor.grad_clip": ("optim.grad_clip", ""),
    "actor_rollout_ref.actor.ppo_mini_batch_size": (
        "workload.train_minibatches",
        "updates per step = data.train_batch_size / ppo_mini_batch_size",
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (
        "workload.micro_batch_size",
        "samples per micro-batch",
    ),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (
        "workload.max_tokens_per_micro_batch",
        "",
    ),
    "actor_rollout_ref.actor.use_dynamic_bsz": (
        "workload.max_tokens_per_micro_batch",
        "set the token budget to batch by tokens",
    ),
    "actor_rollout_ref.actor.ppo_epochs": ("algorithm.ppo_epochs", ""),
    "actor_rollout_ref.actor.clip_ratio": ("algorithm.clip_low", "and algorithm.clip_high"),
    "actor_rollout_ref.actor.clip_ratio_low": ("algorithm.clip_low", ""),
    "actor_rollout_ref.actor.clip_ratio_high": ("algorithm.clip_high", ""),
    "actor_rollout_ref.actor.clip_ratio_c": ("algorithm.dual_clip", ""),
    "actor_rollout_ref.actor.loss_agg_mode": (
        "algorithm.loss_aggregation",
        "token-mean = token_mean, seq-mean-token-sum = seq_mean_token_sum, "
        "seq-mean-token-mean = seq_mean_token_mean",
    ),
    "actor_rollout_ref.actor.entropy_coeff": ("algorithm.entropy_coef", ""),
    "actor_rollout_ref.actor.use_kl_loss": (
        "algorithm.kl_coef",
        "the algorithm's recipe places the KL",
    ),
    "actor_rollout_ref.actor.kl_loss_coef": ("algorithm.kl_coef", ""),
    "actor_rollout_ref.actor.kl_loss_type": (
        "algorithm.kl_estimator",
        "kl = k1, mse = k2, low_var_kl = k3; abs, full: none",
    ),
    "actor_rollout_ref.rollout.n": ("workload.samples_per_prompt", ""),
    "actor_rollout_ref.rollout.temperature": ("workload.temperature", ""),
    "actor_rollout_ref.rollout.top_p": ("workload.top_p", ""),
    "actor_rollout_ref.rollout.top_k": ("workload.top_k", "-1 = 0"),
    "actor_rollout_ref.rollout.name": ("runtime.engine", "vllm | torch"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (
        "plan",
        "the generation unit's tp (rpeg plan)",
    ),
    "critic.optim.lr": ("optim.critic_lr", ""),
    "critic.model.path": ("model.critic_path", ""),
    "reward_model.model.path": ("model.reward_model_path", ""),
    "custom_reward_function.path": (
        "task.reward_modules",
        "a module name, imported (registers rewards)",
    ),
    "algorithm.adv_estimator": (
        "algorithm.name",
        "grpo = grpo, rloo = rloo, reinforce_plus_plus = reinforce_pp, gae = ppo",
    ),
    "algorithm.lam": ("algorithm.gae_lambda", ""),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.normalize_advantage_std", ""),
    "algorithm.use_kl_in_reward": ("algorithm.kl_coef", "the algorithm's recipe places the KL"),
    "algorithm.kl_ctrl.kl_coef": ("algorithm.kl_coef", ""),
    "algorithm.filter_groups.enable": ("algorithm.dynamic_sampling", ""),
    "trainer.total_training_steps": ("runtime.steps", ""),
    "trainer.total_epochs": ("runtime.steps", "steps = epochs x rows / data.train_batch_size"),
    "trainer.save_freq": ("runtime.checkpoint_every", ""),
    "trainer.test_freq": ("runtime.val_every", ""),
    "trainer.val_before_train": ("runtime.val_before_train", ""),
    "trainer.default_local_dir": ("runtime.checkpoint_url", ""),
    "trainer.resume_mode": ("runtime.resume", "auto = true"),
    "trainer.resume_from_path": ("runtime.resume_from", ""),
    "trainer.logger": ("runtime.loggers", "console is always on"),
    "trainer.n_gpus_per_node": ("cluster.num_devices", "devices in all = n_gpus_per_node x nnodes"),
    "trainer.nnodes": ("cluster.num_devices", "devices in all = n_gpus_per_node x nnodes"),
    "trainer.experiment_name": ("runtime.run_id", ""),
}

#: TRL ``GRPOConfig`` argument -> (RPEG field, how the value carries over)
TRL_KEYS: dict[str, tuple[str, str]] = {
    "model_name_or_path": ("model.path", ""),
    "dataset_name": ("task.url", "a local file or datasets folder (no download)"),
    "num_generations": ("workload.samples_per_prompt", ""),
    "max_prompt_length": ("workload.max_prompt_tokens", ""),
    "max_completion_length": ("workload.max_response_tokens", ""),
    "per_device_train_batch_size": ("workload.micro_batch_size", "samples per micro-batch"),
    "generation_batch_size": ("workload.num_prompts", "prompts = samples / num_generations"),
    "learning_rate": ("optim.lr", ""),
    "weight_decay": ("optim.weight_decay", ""),
    "max_grad_norm": ("optim.grad_clip", ""),
    "beta": ("algorithm.kl_coef", ""),
    "epsilon": ("algorithm.clip_low", ""),
    "epsilon_high": ("algorithm.clip_high", ""),
    "num_iterations": ("algorithm.ppo_epochs", ""),
    "loss_type": ("algorithm.name", "dr_grpo = dr_grpo, dapo = dapo; bnpo/grpo: loss_aggregation"),
    "scale_rewards": (
        "algorithm.normalize_advantage_std",
        "true / group = true, false / none = false",
    ),
    "temperature": ("workload.temperature", ""),
    "top_p": ("workload.top_p", ""),
    "top_k": ("workload.top_k", ""),
    "max_steps": ("runtime.steps", ""),
    "save_steps": ("runtime.checkpoint_every", ""),
    "eval_steps": ("runtime.val_every", ""),
    "output_dir": ("runtime.output_dir", ""),
    "report_to": ("runtime.loggers", ""),
    "use_vllm": ("runtime.engine", "true = vllm"),
    "seed": ("runtime.seed", ""),
}


def foreign_hint(dotted: str) -> str | None:
    """``"verl's setting; RPEG's field is task.url (...)"`` for a verl or TRL key, else None."""
    for table, who in ((VERL_KEYS, "verl"), (TRL_KEYS, "TRL")):
        found = table.get(dotted)
        if found is not None:
            field, how = found
            return f"{who}'s setting; RPEG's field is {field}" + (f" ({how})" if how else "")
    return None


def foreign_leaves(prefix: str, value: Any) -> list[str]:
    """The dotted keys under ``prefix`` that :func:`foreign_hint` knows, for an unknown
    section given as a mapping (a verl YAML's ``data:`` block)."""
    if not isinstance(value, dict):
        return [prefix] if foreign_hint(prefix) else []
    out: list[str] = []
    for k, v in value.items():
        out += foreign_leaves(f"{prefix}.{k}", v)
    return out
