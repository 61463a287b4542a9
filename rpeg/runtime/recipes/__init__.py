"""The runtime math of each algorithm of :mod:`rpeg.ir.recipes`, one module per recipe
(advantage and loss terms, shapes in their docstrings); :func:`runtime_recipe` finds one by
the config's ``algorithm.name``. Where KL goes and the shared loss: :mod:`.base`."""

from __future__ import annotations

from types import MappingProxyType

from rpeg.ir.recipes import recipe
from rpeg.runtime.recipes import dapo, dr_grpo, grpo, ppo, reinforce_pp, rloo
from rpeg.runtime.recipes.base import (
    Advantages,
    RuntimeRecipe,
    actor_loss,
    critic_value_loss,
    reward_kl,
)

RUNTIME_RECIPES: MappingProxyType = MappingProxyType(
    {m.RECIPE.name: m.RECIPE for m in (grpo, dr_grpo, dapo, rloo, reinforce_pp, ppo)}
)


def runtime_recipe(name: str) -> RuntimeRecipe:
    """The runtime recipe of algorithm ``name`` (an unknown name lists the known ones)."""
    return RUNTIME_RECIPES[recipe(name).name]


__all__ = [
    "RUNTIME_RECIPES",
    "Advantages",
    "RuntimeRecipe",
    "actor_loss",
    "critic_value_loss",
    "reward_kl",
    "runtime_recipe",
]
