"""RLOO, REINFORCE Leave-One-Out (Ahmadian et al. 2024, Back to Basics: Revisiting
REINFORCE Style Optimization for Learning from Human Feedback in LLMs, arXiv:2402.14740;
the baseline from Kool et al. 2019).

* Stages: generate -> reward -> ref_logprob -> old_logprob -> advantage -> train_actor;
  no critic; the advantage stage reads the reference and old log-probs.
* KL: in the reward, per sequence (the paper's ``r(x, y) - beta * log(pi(y|x) /
  pi_ref(y|x))``, the whole completion one action): ``r_i' = r_i - kl_coef * sum_t KL_t``
  with the per-token estimator ``algorithm.kl_estimator`` between the old policy and the
  reference. Not in the loss.
* Advantage: ``A_i = r_i' - 1/(K-1) * sum_{j != i} r_j'`` on every token of the response.
* Loss: the clipped surrogate (the paper's on-policy REINFORCE is its ratio-1 case).
"""

from __future__ import annotations

from rpeg.config import AlgorithmConfig
from rpeg.ir.recipes import RECIPES
from rpeg.runtime.algorithms import rloo_advantages
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import RankReduce
from rpeg.runtime.recipes.base import Advantages, RuntimeRecipe, reward_kl


def advantages(
    batch: RolloutBatch, a: AlgorithmConfig, group_size: int, reduce: RankReduce
) -> Advantages:
    """rewards ``[B]`` (minus ``kl_coef`` times each response's summed KL ``[B,T] -> [B]``)
    -> ``[B,T]``: the leave-one-out advantage on every real token. No reduction: a group
    never spans ranks."""
    r = batch.rewards.float()
    kl = reward_kl(batch, a)
    if kl is not None:
        r = r - a.kl_coef * kl.sum(-1)
    return Advantages(rloo_advantages(r, group_size)[:, None] * batch.response_mask)


RECIPE = RuntimeRecipe(RECIPES["rloo"], advantages)
