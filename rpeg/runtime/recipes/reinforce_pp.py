"""REINFORCE++ (Hu 2025, REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both
Prompt and Reward Models, arXiv:2501.03262).

* Stages: generate -> reward -> ref_logprob -> old_logprob -> advantage -> train_actor;
  no critic, no group needed (any ``samples_per_prompt``).
* KL: in the reward, per token (the paper's token-level penalty ``r_t = I(t = end) r -
  beta * KL_t``; OpenRLHF ``init_kl_coef``), between the old policy and the reference with
  ``algorithm.kl_estimator``. Not in the loss: counted once.
* Advantage: the token returns ``G_t = sum_{s >= t} gamma^(s-t) r_s`` whitened over every
  response token of the batch (global batch normalisation; over all data-parallel ranks).
* Loss: the clipped surrogate.
"""

from __future__ import annotations

from rpeg.config import AlgorithmConfig
from rpeg.ir.recipes import RECIPES
from rpeg.runtime.algorithms import reinforce_pp_advantages
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import RankReduce
from rpeg.runtime.recipes.base import Advantages, RuntimeRecipe, reward_kl


def advantages(
    batch: RolloutBatch, a: AlgorithmConfig, group_size: int, reduce: RankReduce
) -> Advantages:
    """rewards ``[B]``, KL ``[B,T]`` -> ``[B,T]``: whitened returns of the token rewards."""
    return Advantages(
        reinforce_pp_advantages(
            batch.rewards,
            batch.response_mask,
            kl=reward_kl(batch, a),
            kl_coef=a.kl_coef,
            gamma=a.gamma,
            reduce=reduce,
        )
    )


RECIPE = RuntimeRecipe(RECIPES["reinforce_pp"], advantages)
