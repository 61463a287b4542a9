"""The single-process reference trainer: stage functions called in order, one RL step at a time.

The distributed runtime must reproduce what this does; it reuses the workers and stages.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rpeg.config import RunConfig
from rpeg.runtime import stages
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.data import DataCursor, Example, build_task_data
from rpeg.runtime.engines.torch_engine import TorchEngine
from rpeg.runtime.rewards import RewardSet
from rpeg.runtime.roles import CriticWorker, PolicyWorker


def build_policy(config: RunConfig, log: Callable[[str], None] | None = None):
    """(model, tokenizer, info): the configured model, or the built-in tiny model; with the
    supervised warm-up applied (cached) when ``config.warmup_sft_steps`` > 0."""
    from rpeg.runtime.model_io import TINY_SHAPE, create_tiny, load_model_and_tokenizer

    mc = config.model
    torch.manual_seed(config.runtime.seed)
    if mc.path:
        model, tok = load_model_and_tokenizer(mc.path, mc.dtype)
        key_model = {"path": mc.path}
    else:
        shape = dict(mc.tiny_shape or {})
        model, tok = create_tiny(seed=config.runtime.seed, **shape)
        key_model = {"tiny": {**TINY_SHAPE, **shape}, "seed": config.runtime.seed}
    info: dict = {}
    o = config.optim
    warmup_steps = config.warmup_sft_steps
    if warmup_steps:
        cursor, _ = build_task_data(config.task)
        t = config.task
        model, info = stages_warmup(
            model,
            tok,
            cursor.source if not cursor.finite else list(cursor.source),
            key_parts={
                "model": key_model,
                "task": [t.kind, t.url, t.difficulty, t.seed, t.heldout_size, t.prompt_template],
            },
            steps=warmup_steps,
            lr=o.warmup_sft_lr,
            batch_size=o.warmup_sft_batch_size,
            template=t.prompt_template,
            seed=config.runtime.seed,
            log=log,
        )
    return model, tok, info


def stages_warmup(model, tok, source, **kw):
    from rpeg.runtime.warmup import cached_warmup

    return cached_warmup(model, tok, source, **kw)


class LocalTrainer:
    """GRPO / PPO / RLOO / REINFORCE++ in one process.

    ``step()`` runs: generate -> reward -> [filter groups] -> old log-probs -> ref log-probs
    -> values -> advantages -> train actor (-> train critic) -> weight sync (bounded staleness).
    """

    def __init__(
        self, config: RunConfig | None = None, *, log: Callable[[str], None] | None = None
    ):
        self.config = config or RunConfig()
        self.log = log or (lambda s: None)
        c = self.config
        torch.set_num_threads(c.runtime.torch_threads)
        random.seed(c.runtime.seed)
        self.rewards = RewardSet(c.task.rewards)
        self.cursor, self.heldout = build_task_data(c.task)
        model, tok, self.warmup_info = build_policy(c, self.log)
        self.tokenizer = tok
        a = c.algorithm
        ppo = a.name == "ppo"
        self.reference = None
        if a.use_reference:
            self.reference = PolicyWorker(
                copy.deepcopy(model), tok, workload=c.workload, trainable=False
            )
        engine = None
        if c.runtime.max_staleness > 0:
            engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id, tok.eos_token_id)
        self.actor = PolicyWorker(
            model,
            tok,
            algorithm=a,
            optim=c.optim,
            workload=c.workload,
            value_head=ppo and a.share_actor_critic,
            engine=engine,
            seed=c.runtime.seed,
        )
        self.critic = None
        if ppo and not a.share_actor_critic:
            self.critic = CriticWorker(
                copy.deepcopy(model),
                algorithm=a,
                optim=c.optim,
                workload=c.workload,
                seed=c.runtime.seed,
            )
        self.step_index = 0
        self.history: list[dict[str, float]] = []

    # --- one RL step ----------------------------------------------------------------------
    def stage_kinds(self) -> list[str]:
        """The stage kinds of one step, in order (the graph of ``config.algorithm``)."""
        a = self.config.algorithm
        kinds = ["generate", "reward", "old_logprob"]
        if self.reference is not None:
            kinds.append("ref_logprob")
        if a.name == "ppo":
            kinds.append("values")
        kinds += ["advantage", "train_actor"]
        if self.critic is not None:
            kinds.append("train_critic")
        return kinds

    def step(self) -> dict[str, float]:
        c = self.config
        t0 = time.perf_counter()
        m: dict[str, float] = {"step": float(self.step_index)}
        ctx = stages.StageContext(
            c, actor=self.actor, reference=self.reference, critic=self.critic, rewards=self.rewards
        )
        batch = None
        for kind in self.stage_kinds():
            if kind == "generate":
                batch, sm = stages.run_stage(
                    kind,
                    ctx,
                    None,
                    examples=self.cursor.next(c.workload.num_prompts),
                    seed=c.runtime.seed * 100_003 + self.step_index,
                )
            else:
                batch, sm = stages.run_stage(kind, ctx, batch)
            m.update(sm)
        self._sync_weights(m)
        self.last_batch = batch
        m["step_s"] = time.perf_counter() - t0
        m["tokens_per_s"] = batch.num_tokens / m["step_s"]
        self.step_index += 1
        self.history.append(m)
        return m

    def _sync_weights(self, m: dict[str, float]) -> None:
        """Bounded staleness: refresh the generator once its weights would be > k versions old."""
        eng = self.actor.engine
        if isinstance(eng, TorchEngine) and eng.model is self.actor.lm:
            eng.policy_version = self.actor.policy_version
            return
        if self.actor.policy_version - eng.policy_version > self.config.runtime.max_staleness:
            t0 = time.perf_counter()
            eng.update_weights(self.actor.get_weights(), self.actor.policy_version)
            m["weight_sync_s"] = time.perf_counter() - t0

    # --- evaluation -----------------------------------------------------------------------
    def evaluate(self, examples: list[Example] | None = None) -> float:
        """Greedy accuracy on the held-out examples (a fraction in [0, 1])."""
        examples = self.heldout if examples is None else examples
        if not examples:
            return float("nan")
        batch, _ = stages.generate_stage(
            self._eval_worker(),
            examples,
            1,
            prompt_template=self.config.task.prompt_template,
            params=self.actor.sampling_params(greedy=True),
            seed=0,
        )
        batch, rm = stages.reward_stage(batch, self.rewards)
        return rm["accuracy"]

    def _eval_worker(self) -> PolicyWorker:
        # evaluate the *current* actor weights even when the generator lags behind
        w = copy.copy(self.actor)
        w.engine = TorchEngine(
            self.actor.lm, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        )
        return w

    # --- run ------------------------------------------------------------------------------
    def run(self, steps: int | None = None, out_dir: str | Path | None = None) -> dict:
        steps = steps or self.config.runtime.steps
        out = Path(out_dir or self.config.runtime.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        acc_before = self.evaluate()
        self.log(f"held-out greedy accuracy before RL: {acc_before:.3f}")
        with open(out / "metrics.jsonl", "w") as fh:
            for _ in range(steps):
                m = self.step()
                fh.write(json.dumps(m) + "\n")
                fh.flush()
                self.log(
                    f"step {int(m['step']) + 1}/{steps}: reward {m['reward_mean']:.3f} acc {m['accuracy']:.3f} "
                    f"len {m['response_length']:.1f} kl {m.get('kl', 0.0):.4f} clip {m.get('clip_frac', 0.0):.3f} "
                    f"{m['step_s']:.2f}s"
                )
        acc_after = self.evaluate()
        self.log(f"held-out greedy accuracy after RL: {acc_after:.3f}")
        rewards = [h["reward_mean"] for h in self.history]
        summary = {
            "steps": len(self.history),
            "wall_s": time.perf_counter() - t0 + float(self.warmup_info.get("warmup_s", 0.0)),
            "median_step_s": statistics.median(h["step_s"] for h in self.history)
            if self.history
            else 0.0,
            "reward_first10": sum(rewards[:10]) / max(len(rewards[:10]), 1),
            "reward_last10": sum(rewards[-10:]) / max(len(rewards[-10:]), 1),
            "heldout_acc_before": acc_before,
            "heldout_acc_after": acc_after,
        }
        plot_rewards(self.history, out / "reward_curve.png", acc_before, acc_after)
        return summary

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step_index,
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "cursor": self.cursor.state_dict(),
            "engine_version": self.actor.engine.policy_version,
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_index = int(state["step"])
        self.actor.load_state_dict(state["actor"])
        if self.critic is not None and state.get("critic") is not None:
            self.critic.load_state_dict(state["critic"])
        self.cursor.load_state_dict(state["cursor"])


def plot_rewards(history: list[dict], path: Path, acc_before: float, acc_after: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(h["step"]) + 1 for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward_mean"] for h in history], label="reward (mean)")
    ax.plot(steps, [h["accuracy"] for h in history], label="sample accuracy", alpha=0.6)
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.set_title(f"held-out greedy acc {acc_before:.2f} -> {acc_after:.2f}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["LocalTrainer", "RolloutBatch", "DataCursor", "build_policy", "plot_rewards"]
