"""What every runtime recipe shares: the advantage's result, the KL term in the reward, and
the actor's loss with the KL term where the recipe puts it.

Shapes: ``B`` samples, ``T`` response tokens (``R`` in :class:`RolloutBatch`), ``mask``
``[B,T]`` is 1 on real response tokens. Where KL goes is the recipe's declaration
(:attr:`rpeg.ir.recipes.Recipe.kl`): ``"reward"`` recipes subtract
``kl_coef * KL(pi_old || pi_ref)`` from the reward in their advantage (:func:`reward_kl`),
``"loss"`` recipes add ``kl_coef * aggregate(KL(pi_theta || pi_ref))`` to the loss
(:func:`actor_loss`), ``"none"`` recipes neither; each exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rpeg.config import AlgorithmConfig
from rpeg.ir.recipes import Recipe
from rpeg.runtime.algorithms import aggregate, kl_penalty, masked_mean, policy_loss, value_loss
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import RankReduce

Metrics = dict[str, float]


@dataclass(frozen=True)
class Advantages:
    """An advantage estimator's output: ``advantages`` ``[B,T]`` (0 on padding) and, for a
    recipe with a critic, the value targets ``returns`` ``[B,T]``."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None


#: ``(batch, algorithm, group_size, reduce) -> Advantages``: ``group_size`` is the samples per
#: prompt (groups contiguous); ``reduce`` spans a data-parallel group's batch statistics
AdvantageFn = Callable[[RolloutBatch, AlgorithmConfig, int, RankReduce], Advantages]


@dataclass(frozen=True)
class RuntimeRecipe:
    """A recipe's declaration (``spec``) and its advantage estimator."""

    spec: Recipe
    advantages: AdvantageFn

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kl_in_loss(self) -> bool:
        return self.spec.kl == "loss"

    @property
    def kl_in_reward(self) -> bool:
        return self.spec.kl == "reward"


def reward_kl(batch: RolloutBatch, a: AlgorithmConfig) -> torch.Tensor | None:
    """Per-token ``KL(pi_old || pi_ref)`` ``[B,T]`` (``a.kl_estimator``) for a KL-in-reward
    recipe, 0 on padding; None without reference log-probs or with ``kl_coef`` 0. ``pi_old``:
    the batch's old log-probs (the sampling ones if none were computed). Not differentiated:
    a reward is a constant for the update (verl ``algorithm.use_kl_in_reward``)."""
    if batch.ref_logprobs is None or not a.kl_coef:
        return None
    old = batch.old_logprobs if batch.old_logprobs is not None else batch.sample_logprobs
    return kl_penalty(old, batch.ref_logprobs, a.kl_estimator) * batch.response_mask


def critic_value_loss(
    a: AlgorithmConfig, values: torch.Tensor, micro: RolloutBatch, mask: torch.Tensor
) -> tuple[torch.Tensor, Metrics]:
    """The clipped value loss of ``values`` ``[b,T]`` toward ``micro.returns`` (old values:
    ``micro.values``), aggregated as ``a.loss_aggregation`` -> (scalar, metrics)."""
    return value_loss(
        values,
        micro.values,
        micro.returns,
        mask,
        clip=a.value_clip,
        aggregation=a.loss_aggregation,
    )


def actor_loss(
    recipe: RuntimeRecipe,
    a: AlgorithmConfig,
    micro: RolloutBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """The policy's loss on micro-batch ``micro`` from its forward: ``logprobs`` and
    ``entropy`` ``[b,T]`` (and ``values`` ``[b,T]`` from a shared value head):

    ``clipped surrogate(logprobs, old, advantages) - entropy_coef * H
    (+ kl_coef * KL(pi_theta || pi_ref) if the recipe puts KL in the loss)
    (+ vf_coef * value loss with a shared critic)``, each aggregated as
    ``a.loss_aggregation``; ``is_weights`` ``[b,T]``: the rollout correction's weights.
    The ``kl`` metric (mean per-token KL to the reference) is reported wherever the batch
    has reference log-probs, whether or not the recipe trains on it."""
    mask = micro.response_mask
    pg, m = policy_loss(
        logprobs,
        micro.old_logprobs,
        micro.advantages,
        mask,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip=a.dual_clip,
        aggregation=a.loss_aggregation,
        is_weights=is_weights,
    )
    loss = pg
    # entropy: from each chunk's log-softmax; differentiated only with a coefficient
    if a.entropy_coef:
        loss = loss - a.entropy_coef * aggregate(entropy, mask, a.loss_aggregation)
    m["entropy"] = float(masked_mean(entropy.detach(), mask))
    if micro.ref_logprobs is not None:
        kl = kl_penalty(logprobs, micro.ref_logprobs, a.kl_estimator)
        if recipe.kl_in_loss and a.kl_coef:
            loss = loss + a.kl_coef * aggregate(kl, mask, a.loss_aggregation)
        m["kl"] = float(masked_mean(kl.detach(), mask))
    if values is not None:
        vl, vm = critic_value_loss(a, values, micro, mask)
        loss = loss + a.vf_coef * vl
        m.update(vm, value_loss=float(vl.detach()))
    m["pg_loss"] = float(pg.detach())
    return loss, m
