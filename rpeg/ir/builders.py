"""Builders for the RL pipelines of :mod:`rpeg.ir.recipes`: GRPO, Dr.GRPO, DAPO, RLOO,
REINFORCE++ and PPO, one builder per recipe, reading its stages and defaults from there.

Every builder returns a validated :class:`Graph`. Options (defaults: the recipe's
:class:`rpeg.ir.recipes.Knobs`):

- ``use_reference``: add a ``ref_logprob`` stage (role reference) and a KL term with
  ``kl_coef``. Where the KL goes is the recipe's (``Recipe.kl``), recorded as
  ``params["kl_placement"]``: "loss" (GRPO, Dr.GRPO: train_actor reads ref_logprobs),
  "reward" (RLOO, REINFORCE++, PPO: advantage reads ref_logprobs and old_logprobs) or
  "none" (DAPO: no reference stage, ``kl_coef`` must be 0).
- ``reward``: "rule" (a Python function, role None, reads answers) or "model" (role
  reward_model).
- ``staleness``: the bounded asynchrony k of the weights edge sync_weights -> generate.
- ``group_size``: samples per prompt (the group of a group baseline).
- ``multiturn``: multi-turn rollouts: an ``env`` stage (the environment's steps) fused with
  generate in the group ``generate+env``; generate writes ``actions`` and reads the env's
  ``observations`` for its next turn (docs/ir.md "Multi-turn: the env stage").
- DAPO-style: ``clip_low``, ``clip_high`` (decoupled clip), ``dual_clip``,
  ``dynamic_sampling``, ``overlong_buffer`` (soft overlong penalty length, or None),
  ``loss_aggregation`` ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"),
  ``entropy_coef``; with a critic (PPO) also ``gamma``, ``gae_lambda``, ``value_clip``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rpeg import defaults
from rpeg.errors import Problem
from rpeg.ir.checks import validate
from rpeg.ir.graph import (
    WEIGHTS_STATE,
    FusedGroup,
    Granularity,
    Graph,
    GraphError,
    Role,
    Stage,
    StageKind,
    StateEdge,
)
from rpeg.ir.recipes import ALIASES, RECIPES, Recipe, canonical

__all__ = ["ALIASES", "BUILDERS", "build", "builder_names"]

_SEQ = ("prompts", "responses", "response_mask")
#: multi-turn (``multiturn=True``): the env stage, and the fused group that runs it inside
#: the rollout unit, between the turns of generate (docs/ir.md "Multi-turn: the env stage")
ENV_STAGE = ("env", StageKind.env, None, ("actions",), ("observations",), Granularity.sample)
ROLLOUT_LOOP = "generate+env"
_CRITIC_KNOBS = ("gamma", "gae_lambda", "value_clip")


def _options(r: Recipe) -> dict[str, Any]:
    """The options of ``r``'s builder and their defaults."""
    knobs = asdict(r.defaults)
    if not r.critic:
        for k in _CRITIC_KNOBS:
            knobs.pop(k)
    return {
        "name": None,
        "reward": "rule",
        "staleness": defaults.MAX_STALENESS,
        "multiturn": False,
        **knobs,
    }


def _check_options(r: Recipe, o: dict[str, Any]) -> None:
    p: list[Problem] = []
    if o["reward"] not in ("rule", "model"):
        p.append(Problem(f"{r.name}.reward", f"{o['reward']!r} is not one of rule, model"))
    k = o["staleness"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        p.append(Problem(f"{r.name}.staleness", f"must be an integer >= 0, got {k!r}"))
    if r.kl == "none" and o["kl_coef"]:
        p.append(
            Problem(
                f"{r.name}.kl_coef",
                f"{r.title} has no KL term (recipe kl: none); got {o['kl_coef']!r}, use 0",
            )
        )
    if p:
        raise GraphError(p)


def _params(r: Recipe, o: dict[str, Any]) -> dict[str, Any]:
    use_ref = bool(o["use_reference"]) and r.uses_reference
    params = {k: v for k, v in o.items() if k not in ("name", "staleness", "multiturn")}
    params.update(
        use_reference=use_ref,
        kl_coef=o["kl_coef"] if use_ref else 0.0,
        kl_placement=r.kl,
        clip_high=o["clip_low"] if o["clip_high"] is None else o["clip_high"],
    )
    return params


def _pipeline(r: Recipe, options: dict[str, Any]) -> Graph:
    """The pipeline of recipe ``r`` with a builder's ``options`` (all of them, defaults in)."""
    _check_options(r, options)
    params = _params(r, options)
    name, staleness, critic = options["name"], options["staleness"], r.critic
    use_ref = params["use_reference"]
    kl_in_reward = use_ref and r.kl == "reward"
    kl_in_loss = use_ref and r.kl == "loss"
    model_reward = params["reward"] == "model"
    multiturn = bool(options["multiturn"])

    stages = [
        Stage(
            "generate",
            StageKind.generate,
            Role.actor,
            ("prompts", "observations") if multiturn else ("prompts",),
            ("responses", "response_mask", "sample_logprobs", *(("actions",) if multiturn else ())),
        ),
    ]
    if multiturn:  # the environment's steps between turns, run inside the rollout unit
        stages.append(Stage(*ENV_STAGE))
    stages += [
        Stage(
            "reward",
            StageKind.reward,
            Role.reward_model if model_reward else None,
            _SEQ if model_reward else (*_SEQ, "answers"),
            ("rewards",),
        ),
    ]
    if use_ref:
        stages.append(
            Stage("ref_logprob", StageKind.ref_logprob, Role.reference, _SEQ, ("ref_logprobs",))
        )
    stages.append(Stage("old_logprob", StageKind.old_logprob, Role.actor, _SEQ, ("old_logprobs",)))
    if critic:
        stages.append(Stage("values", StageKind.values, Role.critic, _SEQ, ("values",)))
    adv_reads: tuple[str, ...] = ("rewards", "response_mask")
    if critic:
        adv_reads += ("values",)
    if kl_in_reward:
        adv_reads += ("ref_logprobs", "old_logprobs")
    stages.append(
        Stage(
            "advantage",
            StageKind.advantage,
            None,
            adv_reads,
            ("advantages", "returns") if critic else ("advantages",),
        )
    )
    actor_reads: tuple[str, ...] = (*_SEQ, "old_logprobs", "advantages")
    if kl_in_loss:
        actor_reads += ("ref_logprobs",)
    stages.append(
        Stage(
            "train_actor",
            StageKind.train_actor,
            Role.actor,
            actor_reads,
            ("actor_weights",),
            Granularity.minibatch,
        )
    )
    if critic:
        stages.append(
            Stage(
                "train_critic",
                StageKind.train_critic,
                Role.critic,
                (*_SEQ, "values", "returns"),
                ("critic_weights",),
                Granularity.minibatch,
            )
        )
    stages.append(Stage("sync_weights", StageKind.sync_weights, Role.actor, ("actor_weights",), ()))
    state = [StateEdge("sync_weights", "generate", WEIGHTS_STATE, staleness)]
    if critic:
        state.append(StateEdge("train_critic", "values", "critic_weights", 0))
    g = Graph(
        name=name or r.name,
        algorithm=r.name,
        stages=tuple(stages),
        state_edges=tuple(state),
        fused=(FusedGroup(ROLLOUT_LOOP, ("generate", "env")),) if multiturn else (),
        params=params,
        inputs=("prompts",) if model_reward else ("prompts", "answers"),
    )
    return validate(g)


def _builder(r: Recipe) -> Callable[..., Graph]:
    """The keyword-only builder of recipe ``r``: its options are :func:`_options`."""
    defaults = _options(r)

    def build_recipe(**options: Any) -> Graph:
        unknown = sorted(set(options) - set(defaults))
        if unknown:
            raise GraphError(
                [
                    Problem(f"{r.name}.{k}", f"unknown option; allowed: {', '.join(defaults)}")
                    for k in unknown
                ]
            )
        return _pipeline(r, {**defaults, **options})

    build_recipe.__name__ = build_recipe.__qualname__ = r.name
    build_recipe.__doc__ = f"{r.title}: {r.advantage}; KL: {r.kl}. Sources: {'; '.join(r.sources)}"
    build_recipe.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
            for k, v in defaults.items()
        ]
    )
    return build_recipe


BUILDERS: dict[str, Callable[..., Graph]] = {n: _builder(r) for n, r in RECIPES.items()}
grpo = BUILDERS["grpo"]
dr_grpo = BUILDERS["dr_grpo"]
dapo = BUILDERS["dapo"]
rloo = BUILDERS["rloo"]
reinforce_pp = BUILDERS["reinforce_pp"]
ppo = BUILDERS["ppo"]


def builder_names() -> list[str]:
    return list(BUILDERS)


def build(name: str, **options: Any) -> Graph:
    """Build the pipeline ``name`` (a recipe's name or alias) with ``options``."""
    fn = BUILDERS.get(canonical(name))
    if fn is None:
        raise GraphError(
            [Problem("builder", f"unknown pipeline {name!r}; allowed: {', '.join(BUILDERS)}")]
        )
    return fn(**options)
