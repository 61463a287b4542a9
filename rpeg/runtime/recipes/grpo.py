"""GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

* Stages: generate -> reward -> ref_logprob -> old_logprob -> advantage -> train_actor;
  no critic.
* Advantage (outcome supervision, section 4.1.2): each sample's reward normalised within
  its prompt's group, ``A_i = (r_i - mean_g r) / (std_g r + eps)`` (unbiased std), the same
  for every token of the response. ``algorithm.normalize_advantage_std: false`` drops the
  std (what the dr_grpo recipe does always).
* KL: in the loss (eq. 3: ``beta * D_KL`` with the unbiased k3 estimator
  ``pi_ref/pi - log(pi_ref/pi) - 1`` on the current policy's tokens; verl
  ``use_kl_loss: true``, ``kl_loss_type: low_var_kl``); ``kl_coef`` is beta, 0 by default
  (the paper trains with 0.04).
* Loss: the clipped surrogate, aggregated as ``algorithm.loss_aggregation`` (the paper's
  per-sequence mean is ``seq_mean_token_mean``; the default ``token_mean`` follows DAPO).
"""

from __future__ import annotations

from rpeg.config import AlgorithmConfig
from rpeg.ir.recipes import RECIPES
from rpeg.runtime.algorithms import grpo_advantages
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import RankReduce
from rpeg.runtime.recipes.base import Advantages, RuntimeRecipe


def group_advantages(batch: RolloutBatch, group_size: int, *, normalize_std: bool) -> Advantages:
    """rewards ``[B]`` (groups of ``group_size`` contiguous rows) -> ``[B,T]``: the group's
    normalised reward on every real token. No reduction: a group never spans ranks."""
    adv = grpo_advantages(batch.rewards, group_size, normalize_std=normalize_std)
    return Advantages(adv[:, None] * batch.response_mask)


def advantages(
    batch: RolloutBatch, a: AlgorithmConfig, group_size: int, reduce: RankReduce
) -> Advantages:
    """GRPO's advantage ``[B,T]``: group mean and std (std as ``a`` says)."""
    return group_advantages(batch, group_size, normalize_std=a.normalize_advantage_std)


RECIPE = RuntimeRecipe(RECIPES["grpo"], advantages)
