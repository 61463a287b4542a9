"""Dr.GRPO, "GRPO done right" (Liu et al. 2025, Understanding R1-Zero-Like Training: A
Critical Perspective, arXiv:2503.20783).

GRPO with its two normalisations removed (section 3.1): the std of the group's rewards
(question-level difficulty bias) and the ``1/|o_i|`` length normalisation (response-level
length bias).

* Stages: GRPO's.
* Advantage: ``A_i = r_i - mean_g r`` on every token of the response, whatever
  ``algorithm.normalize_advantage_std`` says.
* KL: GRPO's placement, in the loss, when ``kl_coef`` > 0 (the paper's Dr.GRPO objective is
  written without the KL term; ``kl_coef`` defaults to 0).
* Loss: the clipped surrogate summed over each response's tokens; the recipe's preset
  aggregation is ``seq_mean_token_sum`` (the paper divides the sum by a constant, the
  generation budget, which only rescales the learning rate).
"""

from __future__ import annotations

from rpeg.config import AlgorithmConfig
from rpeg.ir.recipes import RECIPES
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import RankReduce
from rpeg.runtime.recipes.base import Advantages, RuntimeRecipe
from rpeg.runtime.recipes.grpo import group_advantages


def advantages(
    batch: RolloutBatch, a: AlgorithmConfig, group_size: int, reduce: RankReduce
) -> Advantages:
    """rewards ``[B]`` -> ``[B,T]``: the reward minus its group's mean, no std."""
    return group_advantages(batch, group_size, normalize_std=False)


RECIPE = RuntimeRecipe(RECIPES["dr_grpo"], advantages)
