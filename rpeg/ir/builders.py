"""Builders for the usual RL pipelines: GRPO, PPO, RLOO, REINFORCE++ (and DAPO-style GRPO).

Every builder returns a validated :class:`Graph`. Common options:

- ``use_reference``: add a ``ref_logprob`` stage (role reference) and a KL term with
  ``kl_coef``; ``kl_placement`` = "loss" (GRPO default: train_actor reads ref_logprobs) or
  "reward" (PPO/RLOO/REINFORCE++ default: advantage reads ref_logprobs and old_logprobs).
- ``reward``: "rule" (a Python function, role None, reads answers) or "model" (role
  reward_model).
- ``staleness``: the bounded asynchrony k of the weights edge sync_weights -> generate.
- DAPO-style: ``clip_low``, ``clip_high`` (decoupled clip), ``dual_clip``,
  ``dynamic_sampling``, ``overlong_buffer`` (soft overlong penalty length, or None),
  ``loss_aggregation`` ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpeg.errors import Problem
from rpeg.ir.checks import validate
from rpeg.ir.graph import (
    WEIGHTS_STATE,
    Granularity,
    Graph,
    GraphError,
    Role,
    Stage,
    StageKind,
    StateEdge,
)

_SEQ = ("prompts", "responses", "response_mask")


def _common_params(
    *,
    use_reference: bool,
    kl_coef: float,
    kl_placement: str,
    reward: str,
    clip_low: float,
    clip_high: float | None,
    dual_clip: float | None,
    dynamic_sampling: bool,
    overlong_buffer: int | None,
    loss_aggregation: str,
    entropy_coef: float,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "use_reference": use_reference,
        "kl_coef": kl_coef if use_reference else 0.0,
        "kl_placement": kl_placement,
        "reward": reward,
        "clip_low": clip_low,
        "clip_high": clip_low if clip_high is None else clip_high,
        "dual_clip": dual_clip,
        "dynamic_sampling": dynamic_sampling,
        "overlong_buffer": overlong_buffer,
        "loss_aggregation": loss_aggregation,
        "entropy_coef": entropy_coef,
        **extra,
    }


def _check_options(algorithm: str, reward: str, staleness: Any, kl_placement: str) -> None:
    p: list[Problem] = []
    if reward not in ("rule", "model"):
        p.append(Problem(f"{algorithm}.reward", f"{reward!r} is not one of rule, model"))
    if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
        p.append(Problem(f"{algorithm}.staleness", f"must be an integer >= 0, got {staleness!r}"))
    if kl_placement not in ("loss", "reward"):
        p.append(
            Problem(f"{algorithm}.kl_placement", f"{kl_placement!r} is not one of loss, reward")
        )
    if p:
        raise GraphError(p)


def _pipeline(algorithm: str, *, critic: bool, options: dict[str, Any]) -> Graph:
    """The pipeline of ``algorithm`` from a builder's keyword arguments (its ``locals()``)."""
    options = dict(options)
    name, staleness = options.pop("name"), options.pop("staleness")
    _check_options(algorithm, options["reward"], staleness, options["kl_placement"])
    params = _common_params(**options)
    use_ref = params["use_reference"]
    kl_in_reward = use_ref and params["kl_placement"] == "reward"
    kl_in_loss = use_ref and params["kl_placement"] == "loss"
    model_reward = params["reward"] == "model"

    stages = [
        Stage(
            "generate",
            StageKind.generate,
            Role.actor,
            ("prompts",),
            ("responses", "response_mask", "sample_logprobs"),
        ),
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
        name=name or algorithm,
        algorithm=algorithm,
        stages=tuple(stages),
        state_edges=tuple(state),
        params=params,
        inputs=("prompts",) if model_reward else ("prompts", "answers"),
    )
    return validate(g)


def grpo(
    *,
    name: str | None = None,
    use_reference: bool = True,
    kl_coef: float = 0.001,
    kl_placement: str = "loss",
    reward: str = "rule",
    staleness: int = 0,
    group_size: int = 16,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    dynamic_sampling: bool = False,
    overlong_buffer: int | None = None,
    loss_aggregation: str = "token_mean",
    entropy_coef: float = 0.0,
) -> Graph:
    """GRPO: group-normalized rewards as advantages, no critic; KL in the loss by default."""
    return _pipeline("grpo", critic=False, options=locals())


def dapo(
    *,
    name: str | None = None,
    use_reference: bool = False,
    kl_coef: float = 0.0,
    kl_placement: str = "loss",
    reward: str = "rule",
    staleness: int = 0,
    group_size: int = 16,
    clip_low: float = 0.2,
    clip_high: float | None = 0.28,
    dual_clip: float | None = None,
    dynamic_sampling: bool = True,
    overlong_buffer: int | None = 4096,
    loss_aggregation: str = "token_mean",
    entropy_coef: float = 0.0,
) -> Graph:
    """DAPO: GRPO without KL, with clip-higher, dynamic sampling, overlong shaping, token_mean."""
    return _pipeline("dapo", critic=False, options=locals())


def rloo(
    *,
    name: str | None = None,
    use_reference: bool = True,
    kl_coef: float = 0.05,
    kl_placement: str = "reward",
    reward: str = "rule",
    staleness: int = 0,
    group_size: int = 16,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    dynamic_sampling: bool = False,
    overlong_buffer: int | None = None,
    loss_aggregation: str = "token_mean",
    entropy_coef: float = 0.0,
) -> Graph:
    """RLOO: leave-one-out baseline over each prompt's group, no critic; KL in the reward."""
    return _pipeline("rloo", critic=False, options=locals())


def reinforce_pp(
    *,
    name: str | None = None,
    use_reference: bool = True,
    kl_coef: float = 0.01,
    kl_placement: str = "reward",
    reward: str = "rule",
    staleness: int = 0,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    dynamic_sampling: bool = False,
    overlong_buffer: int | None = None,
    loss_aggregation: str = "token_mean",
    entropy_coef: float = 0.0,
) -> Graph:
    """REINFORCE++: token-level KL in the reward, batch-normalized returns, no critic."""
    return _pipeline("reinforce_pp", critic=False, options=locals())


def ppo(
    *,
    name: str | None = None,
    use_reference: bool = True,
    kl_coef: float = 0.05,
    kl_placement: str = "reward",
    reward: str = "rule",
    staleness: int = 0,
    gamma: float = 1.0,
    gae_lambda: float = 0.95,
    value_clip: float = 0.2,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    dynamic_sampling: bool = False,
    overlong_buffer: int | None = None,
    loss_aggregation: str = "token_mean",
    entropy_coef: float = 0.0,
) -> Graph:
    """PPO: critic (values, train_critic) and GAE advantages; KL in the reward by default."""
    return _pipeline("ppo", critic=True, options=locals())


BUILDERS: dict[str, Callable[..., Graph]] = {
    "grpo": grpo,
    "ppo": ppo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "dapo": dapo,
}

ALIASES = {
    "reinforce++": "reinforce_pp",
    "reinforce-pp": "reinforce_pp",
    "reinforcepp": "reinforce_pp",
}


def builder_names() -> list[str]:
    return list(BUILDERS)


def build(name: str, **options: Any) -> Graph:
    """Build the pipeline ``name`` (grpo, ppo, rloo, reinforce_pp, dapo) with ``options``."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    fn = BUILDERS.get(key)
    if fn is None:
        raise GraphError(
            [Problem("builder", f"unknown pipeline {name!r}; allowed: {', '.join(BUILDERS)}")]
        )
    import inspect

    allowed = set(inspect.signature(fn).parameters)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise GraphError(
            [
                Problem(f"{key}.{k}", f"unknown option; allowed: {', '.join(sorted(allowed))}")
                for k in unknown
            ]
        )
    return fn(**options)
