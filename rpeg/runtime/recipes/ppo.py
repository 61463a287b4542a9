"""PPO for language models (Schulman et al. 2017, arXiv:1707.06347; GAE, Schulman et al.
2016, arXiv:1506.02438; the RLHF form of Ouyang et al. 2022, InstructGPT,
arXiv:2203.02155, and Ziegler et al. 2019, arXiv:1909.08593).

* Stages: generate -> reward -> ref_logprob -> old_logprob -> values -> advantage ->
  train_actor + train_critic (a separate critic, or a value head on the actor's trunk with
  ``algorithm.share_actor_critic``).
* KL: in the reward, per token: ``r_t = I(t = last) r - kl_coef * KL_t(pi_old || pi_ref)``
  (InstructGPT eq. 2; verl ``algorithm.use_kl_in_reward``). Not in the loss.
* Advantage: GAE over the critic's values (``gamma``, ``gae_lambda``), whitened over the
  batch (every data-parallel rank); ``returns = A + V`` are the critic's targets.
* Loss: the clipped surrogate; the critic's clipped value loss (``value_clip``), added with
  ``vf_coef`` when actor and critic share a trunk.
"""

from __future__ import annotations

from rpeg.config import AlgorithmConfig
from rpeg.ir.recipes import RECIPES
from rpeg.runtime.algorithms import gae_advantages, masked_whiten, outcome_token_rewards
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import RankReduce
from rpeg.runtime.recipes.base import Advantages, RuntimeRecipe, reward_kl


def advantages(
    batch: RolloutBatch, a: AlgorithmConfig, group_size: int, reduce: RankReduce
) -> Advantages:
    """rewards ``[B]``, values ``[B,T]``, KL ``[B,T]`` -> (whitened GAE advantages ``[B,T]``,
    returns ``[B,T]``)."""
    if batch.values is None:
        raise ValueError("PPO advantages need values (run the values stage first)")
    mask = batch.response_mask
    tok_r = outcome_token_rewards(batch.rewards, mask)
    kl = reward_kl(batch, a)
    if kl is not None:
        tok_r = tok_r - a.kl_coef * kl
    adv, ret = gae_advantages(tok_r, batch.values, mask, gamma=a.gamma, lam=a.gae_lambda)
    return Advantages(masked_whiten(adv, mask, reduce=reduce), ret)


RECIPE = RuntimeRecipe(RECIPES["ppo"], advantages)
