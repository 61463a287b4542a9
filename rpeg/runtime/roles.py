"""Model state holders, one per model role; a Dask actor wraps one of these.

* :class:`PolicyWorker`: an actor (trainable) or reference (frozen) causal LM, optionally with a
  shared value head (actor-critic on one trunk), its optimizer, RNG and generation engine.
* :class:`CriticWorker`: a separate critic (trunk + value head) and its optimizer.

Each method is one stage kind: ``generate``, ``compute_logprobs``, ``compute_values``,
``train_step``; ``get_weights``/``set_weights`` sync weights; ``state_dict``/``load_state_dict``
checkpoint everything (weights, optimizer, RNG, policy version).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from rpeg.config import AlgorithmConfig, OptimConfig, WorkloadConfig
from rpeg.errors import ConfigError, Problem
from rpeg.runtime.algorithms import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    policy_loss,
    token_logprobs,
    value_loss,
)
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.engines.base import GenerationEngine, GenerationOutput, SamplingParams
from rpeg.runtime.engines.torch_engine import TorchEngine
from rpeg.runtime.model_io import ActorCritic, CriticModel
from rpeg.runtime.parallel import LOCAL, RankReduce


def _loss_count(b: RolloutBatch, aggregation: str) -> float:
    """What a mini-batch loss averages over: response tokens (token_mean) or sequences."""
    return float(b.response_mask.sum()) if aggregation == "token_mean" else float(b.size)


def _mini_total(mini: RolloutBatch, aggregation: str, reduce: RankReduce) -> float:
    """The mini-batch's loss count over every data-parallel rank (called once per mini-batch,
    in the same order on every rank)."""
    t = reduce.sum(torch.tensor([_loss_count(mini, aggregation)], dtype=torch.float64))
    return max(float(t[0]), 1.0)


def _micro_weight(micro: RolloutBatch, total: float, aggregation: str, reduce: RankReduce) -> float:
    """Weight of a micro-batch's loss so that accumulating micro-batches (and DDP's average of
    gradients over ``world_size`` ranks) equals one loss over the whole global mini-batch."""
    return reduce.world_size * _loss_count(micro, aggregation) / total


def _grad_norm_and_clip(params, max_norm: float) -> float:
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def minibatch_updates(
    module,
    optimizer,
    batch: RolloutBatch,
    micro_loss: Callable[[RolloutBatch], tuple[torch.Tensor, dict[str, float]]],
    *,
    algorithm: AlgorithmConfig,
    workload: WorkloadConfig,
    grad_clip: float,
    generator: torch.Generator,
    reduce: RankReduce,
    grad_norm_key: str = "grad_norm",
) -> dict[str, float]:
    """``algorithm.ppo_epochs`` passes over ``batch`` in ``workload.train_minibatches``
    shuffled mini-batches, one optimizer step each, accumulating micro-batches of
    ``workload.micro_batch_size``. ``micro_loss(micro) -> (loss, metrics)``; each micro-batch
    loss is weighted so that accumulation (and DDP's average over ranks) equals one loss over
    the global mini-batch. Returns the metrics averaged over optimizer steps, with the
    gradient norm (before clipping) under ``grad_norm_key``."""
    module.train()
    sums: dict[str, float] = {}
    steps = 0
    agg = algorithm.loss_aggregation
    for _ in range(algorithm.ppo_epochs):
        for mini in batch.split(workload.train_minibatches, generator=generator):
            optimizer.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            total = _mini_total(mini, agg, reduce)
            for micro in mini.micro_batches(workload.micro_batch_size):
                w = _micro_weight(micro, total, agg, reduce)
                loss, m = micro_loss(micro)
                (loss * w).backward()
                for k, v in m.items():
                    stats[k] = stats.get(k, 0.0) + w * v
            stats[grad_norm_key] = _grad_norm_and_clip(module.parameters(), grad_clip)
            optimizer.step()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    module.eval()
    return {k: v / max(steps, 1) for k, v in sums.items()}


class PolicyWorker:
    """Holds one causal LM (actor or reference) and, if trainable, its optimizer.

    ``engine``: the generation engine; ``None`` builds a :class:`TorchEngine` on this model
    (on-policy: generation always sees the latest weights). Pass another engine (e.g. a vLLM
    engine or a TorchEngine over a copy) for bounded staleness; sync it with :meth:`get_weights`.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        algorithm: AlgorithmConfig | None = None,
        optim: OptimConfig | None = None,
        workload: WorkloadConfig | None = None,
        trainable: bool = True,
        value_head: bool = False,
        engine: GenerationEngine | None = None,
        seed: int = 0,
        reduce: RankReduce = LOCAL,
    ):
        self.algorithm = algorithm or AlgorithmConfig()
        self.optim_cfg = optim or OptimConfig()
        self.workload = workload or WorkloadConfig()
        self.reduce = reduce  # data-parallel loss normalization (rpeg.runtime.parallel)
        self.tokenizer = tokenizer
        self.trainable = trainable
        self.lm = model
        self.module = ActorCritic(model) if value_head else model
        self.shared_critic = value_head
        self.policy_version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.engine: GenerationEngine = engine or TorchEngine(
            model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id
        )
        self.optimizer = None
        if trainable:
            groups = [
                {
                    "params": [p for p in model.parameters() if p.requires_grad],
                    "lr": self.optim_cfg.lr,
                }
            ]
            if value_head:
                groups.append(
                    {
                        "params": list(self.module.value_head.parameters()),
                        "lr": self.optim_cfg.critic_lr,
                    }
                )
            self.optimizer = torch.optim.AdamW(
                groups, weight_decay=self.optim_cfg.weight_decay, betas=(0.9, 0.99)
            )
        else:
            self.module.requires_grad_(False)
        self.module.eval()

    # --- generation -----------------------------------------------------------------------
    def encode_prompts(
        self, prompts: Sequence[str], max_prompt_tokens: int | None = None
    ) -> list[list[int]]:
        """Token ids (with BOS) for each prompt; a prompt over ``max_prompt_tokens`` is an error."""
        ids = [self.tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
        if self.tokenizer.bos_token_id is not None:
            ids = [
                x if x[:1] == [self.tokenizer.bos_token_id] else [self.tokenizer.bos_token_id, *x]
                for x in ids
            ]
        limit = max_prompt_tokens or self.workload.max_prompt_tokens
        ctx = getattr(self.lm.config, "max_position_embeddings", None)
        problems = []
        for i, x in enumerate(ids):
            if len(x) > limit:
                problems.append(
                    Problem(
                        f"prompt {i}",
                        f"{len(x)} tokens > workload.max_prompt_tokens={limit}: {prompts[i][:60]!r}",
                    )
                )
            elif ctx is not None and len(x) + self.workload.max_response_tokens > ctx:
                problems.append(
                    Problem(
                        f"prompt {i}",
                        f"{len(x)} prompt + {self.workload.max_response_tokens} response tokens exceed "
                        f"the model context of {ctx} tokens",
                    )
                )
        if problems:
            raise ConfigError(problems, title="prompts do not fit")
        return ids

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        w = self.workload
        return SamplingParams(
            max_new_tokens=w.max_response_tokens,
            temperature=0.0 if greedy else w.temperature,
            top_p=w.top_p,
            top_k=w.top_k,
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams | None = None,
        *,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        return self.engine.generate(
            prompt_ids, params or self.sampling_params(), seed=seed, max_new_tokens=max_new_tokens
        )

    # --- forward passes -------------------------------------------------------------------
    def _forward(self, mb: RolloutBatch, temperature: float):
        """-> (logprobs ``[b,R]``, logits ``[b,R,V]``, values ``[b,R]`` or None) for a micro-batch."""
        r = mb.response_ids.shape[1]
        ids, mask = mb.input_ids, mb.attention_mask
        pos = mb.position_ids
        if self.shared_critic:
            out = self.module(ids, mask, pos, keep_last=r + 1)
            logits, values = out.logits[:, :-1], out.values[:, :-1]
        else:
            logits = self.module(
                input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=r + 1
            ).logits[:, :-1]
            values = None
        lp = token_logprobs(logits, mb.response_ids, temperature)
        return lp, logits, values

    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch, *, with_entropy: bool = False):
        """Log-probs ``[B,R]`` of the batch's responses under this model (0 on padding);
        with ``with_entropy`` also the per-token entropy ``[B,R]``."""
        self.module.eval()
        mbs = self.workload.micro_batch_size
        lps, ents = [], []
        r = batch.response_ids.shape[1]
        for i in range(0, batch.size, mbs):
            mb = batch.select(torch.arange(i, min(i + mbs, batch.size)))
            lp, logits, _ = self._forward(mb, batch.temperature)
            lps.append(torch.nn.functional.pad(lp * mb.response_mask, (0, r - lp.shape[1])))
            if with_entropy:
                e = entropy_from_logits(logits, batch.temperature) * mb.response_mask
                ents.append(torch.nn.functional.pad(e, (0, r - e.shape[1])))
        lp = torch.cat(lps, dim=0)
        return (lp, torch.cat(ents, dim=0)) if with_entropy else lp

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """Values ``[B,R]`` from the shared value head (actor-critic on one trunk)."""
        return self.compute_logprobs_and_values(batch)[1]

    @torch.no_grad()
    def compute_logprobs_and_values(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor-critic sharing: log-probs ``[B,R]`` and values ``[B,R]`` from one forward per
        micro-batch (0 on padding)."""
        if not self.shared_critic:
            raise ConfigError(
                [Problem("algorithm.share_actor_critic", "this policy has no value head")]
            )
        self.module.eval()
        lps, vals, r = [], [], batch.response_ids.shape[1]
        for i in range(0, batch.size, self.workload.micro_batch_size):
            mb = batch.select(torch.arange(i, min(i + self.workload.micro_batch_size, batch.size)))
            lp, _, v = self._forward(mb, batch.temperature)
            lps.append(torch.nn.functional.pad(lp * mb.response_mask, (0, r - lp.shape[1])))
            vals.append(torch.nn.functional.pad(v * mb.response_mask, (0, r - v.shape[1])))
        return torch.cat(lps, dim=0), torch.cat(vals, dim=0)

    # --- training -------------------------------------------------------------------------
    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Minibatched clipped-policy updates over ``batch`` (needs ``advantages`` and
        ``old_logprobs``; uses ``ref_logprobs`` for the KL term, ``values``/``returns`` when
        the critic is shared). Increments :attr:`policy_version` once."""
        if self.optimizer is None:
            raise RuntimeError("train_step on a frozen (reference) worker")
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError(
                "train_step needs advantages and old_logprobs (run the advantage stage first)"
            )
        a = self.algorithm
        t0 = time.perf_counter()
        stale = bool((batch.policy_version < self.policy_version).any())
        use_behaviour = a.off_policy_correction == "tis" and stale

        def micro_loss(micro: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
            lp, logits, values = self._forward(micro, batch.temperature)
            mask = micro.response_mask
            pg, m = policy_loss(
                lp,
                micro.old_logprobs,
                micro.advantages,
                mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                dual_clip=a.dual_clip,
                aggregation=a.loss_aggregation,
                behaviour_logprobs=micro.sample_logprobs if use_behaviour else None,
                tis_cap=a.tis_cap,
            )
            loss = pg
            ent = entropy_from_logits(
                logits.detach() if a.entropy_coef == 0 else logits, batch.temperature
            )
            if a.entropy_coef:
                loss = loss - a.entropy_coef * aggregate(ent, mask, a.loss_aggregation)
            m["entropy"] = float(masked_mean(ent.detach(), mask))
            if micro.ref_logprobs is not None:
                kl = kl_penalty(lp, micro.ref_logprobs, a.kl_estimator)
                if a.kl_coef:
                    loss = loss + a.kl_coef * aggregate(kl, mask, a.loss_aggregation)
                m["kl"] = float(masked_mean(kl.detach(), mask))
            if self.shared_critic and values is not None:
                vl, vm = value_loss(
                    values,
                    micro.values,
                    micro.returns,
                    mask,
                    clip=a.value_clip,
                    aggregation=a.loss_aggregation,
                )
                loss = loss + a.vf_coef * vl
                m.update(vm, value_loss=float(vl.detach()))
            m["pg_loss"] = float(pg.detach())
            return loss, m

        out = minibatch_updates(
            self.module,
            self.optimizer,
            batch,
            micro_loss,
            algorithm=a,
            workload=self.workload,
            grad_clip=self.optim_cfg.grad_clip,
            generator=self.generator,
            reduce=self.reduce,
        )
        self.policy_version += 1
        dt = time.perf_counter() - t0
        out["train_s"] = dt
        out["train_tokens_per_s"] = a.ppo_epochs * batch.num_tokens / max(dt, 1e-9)
        return out

    # --- weights and checkpoints ----------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """The LM weights (what a generation engine needs), detached copies on CPU."""
        return {k: v.detach().cpu().clone() for k, v in self.lm.state_dict().items()}

    def set_weights(
        self, weights: Mapping[str, torch.Tensor], policy_version: int | None = None
    ) -> None:
        self.lm.load_state_dict(weights, strict=True)
        if policy_version is not None:
            self.policy_version = policy_version

    def state_dict(self) -> dict:
        """Weights (incl. value head), optimizer, RNG states and policy version."""
        return {
            "module": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict())
            if self.optimizer is not None
            else None,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "policy_version": self.policy_version,
        }

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.policy_version = int(state["policy_version"])


class CriticWorker:
    """A separate critic (trunk + value head, started from a causal LM) and its optimizer."""

    def __init__(
        self,
        lm,
        *,
        algorithm: AlgorithmConfig | None = None,
        optim: OptimConfig | None = None,
        workload: WorkloadConfig | None = None,
        seed: int = 0,
        reduce: RankReduce = LOCAL,
    ):
        self.algorithm = algorithm or AlgorithmConfig()
        self.optim_cfg = optim or OptimConfig()
        self.workload = workload or WorkloadConfig()
        self.reduce = reduce
        self.module = CriticModel(lm)
        self.optimizer = torch.optim.AdamW(
            self.module.parameters(),
            lr=self.optim_cfg.critic_lr,
            weight_decay=self.optim_cfg.weight_decay,
        )
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.module.eval()

    def _values(self, mb: RolloutBatch) -> torch.Tensor:
        r = mb.response_ids.shape[1]
        return self.module(
            mb.input_ids, mb.attention_mask, mb.position_ids, keep_last=r + 1
        ).values[:, :-1]

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """Values ``[B,R]``: ``V_t`` is the value of the state before response token ``t``."""
        self.module.eval()
        out, r = [], batch.response_ids.shape[1]
        for i in range(0, batch.size, self.workload.micro_batch_size):
            mb = batch.select(torch.arange(i, min(i + self.workload.micro_batch_size, batch.size)))
            out.append(
                torch.nn.functional.pad(
                    self._values(mb) * mb.response_mask, (0, r - mb.response_ids.shape[1])
                )
            )
        return torch.cat(out, dim=0)

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Minibatched clipped value-loss updates toward ``batch.returns``."""
        if batch.returns is None or batch.values is None:
            raise ValueError(
                "critic train_step needs values and returns (run the advantage stage first)"
            )
        a = self.algorithm
        t0 = time.perf_counter()

        def micro_loss(micro: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
            vl, m = value_loss(
                self._values(micro),
                micro.values,
                micro.returns,
                micro.response_mask,
                clip=a.value_clip,
                aggregation=a.loss_aggregation,
            )
            m["value_loss"] = float(vl.detach())
            return vl, m

        out = minibatch_updates(
            self.module,
            self.optimizer,
            batch,
            micro_loss,
            algorithm=a,
            workload=self.workload,
            grad_clip=self.optim_cfg.grad_clip,
            generator=self.generator,
            reduce=self.reduce,
            grad_norm_key="critic_grad_norm",
        )
        out["critic_train_s"] = time.perf_counter() - t0
        return out

    def state_dict(self) -> dict:
        return {
            "module": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
