"""DAPO (Yu et al. 2025, Decoupled Clip and Dynamic sAmpling Policy Optimization,
arXiv:2503.14476).

* Stages: GRPO's without the reference (no ``ref_logprob`` stage, no reference model).
* Advantage: GRPO's group mean/std normalisation (eq. 9's ``A_i``).
* KL: none (section 2.3: the long-CoT policy is meant to move away from the initial model);
  the builder refuses ``kl_coef`` > 0.
* Loss: the clipped surrogate with clip-higher (``clip_high`` 0.28 against ``clip_low``
  0.2, section 3.1), aggregated per token over the whole batch (``token_mean``, section
  3.3).
* Also (config knobs, the recipe's presets): dynamic sampling -- groups whose rewards are
  all equal are dropped (``algorithm.dynamic_sampling``, section 3.2; rpeg.runtime.stages
  .filter_groups) -- and the soft overlong punishment over the last
  ``overlong_penalty_tokens`` of the budget (section 3.4; rpeg.runtime.stages.reward_stage).
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
    """rewards ``[B]`` -> ``[B,T]``: GRPO's group-normalised reward on every real token."""
    return group_advantages(batch, group_size, normalize_std=True)


RECIPE = RuntimeRecipe(RECIPES["dapo"], advantages)
