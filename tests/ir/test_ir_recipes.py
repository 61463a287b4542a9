"""rpeg.ir.recipes: one declaration per algorithm, read by the builders and the config."""

from dataclasses import asdict
from typing import get_args

import pytest

from rpeg.config import AlgorithmConfig, AlgorithmName, WorkloadConfig
from rpeg.ir import BUILDERS, RECIPE_NAMES, RECIPES, Role, build, recipe
from rpeg.ir.recipes import KNOBS, UnknownRecipe


def test_config_names_are_the_recipes():
    assert set(get_args(AlgorithmName)) == set(RECIPE_NAMES)
    assert set(BUILDERS) == set(RECIPE_NAMES)
    assert set(RECIPE_NAMES) == {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"}


def test_shared_knob_defaults_are_the_configs():
    """One default per knob: the builders' shared defaults are the config's."""
    a, w = AlgorithmConfig(), WorkloadConfig()
    k = asdict(KNOBS)
    assert k.pop("group_size") == w.samples_per_prompt == 8
    assert k.pop("overlong_buffer") is None and a.overlong_penalty_tokens == 0
    for name, value in k.items():
        assert getattr(a, name) == value, name
    assert k["kl_coef"] == 0.0


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_builder_defaults_are_the_recipes(name):
    r = recipe(name)
    g = build(name)
    d = asdict(r.defaults)
    for knob in ("kl_coef", "clip_low", "clip_high", "loss_aggregation", "group_size"):
        assert g.params[knob] == d[knob], knob
    assert g.params["kl_placement"] == r.kl
    assert g.params["dynamic_sampling"] is d["dynamic_sampling"]
    assert g.params["overlong_buffer"] == d["overlong_buffer"]


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_kl_placement_decides_who_reads_the_reference(name):
    """KL in the loss: train_actor reads ref_logprobs; in the reward: the advantage does
    (with the old log-probs); none: no reference stage even when asked for one."""
    r = RECIPES[name]
    g = build(name, use_reference=True)
    actor_reads = "ref_logprobs" in g.stage("train_actor").reads
    adv_reads = "ref_logprobs" in g.stage("advantage").reads
    if r.kl == "loss":
        assert actor_reads and not adv_reads
    elif r.kl == "reward":
        assert adv_reads and not actor_reads
        assert "old_logprobs" in g.stage("advantage").reads
    else:
        assert not g.has_stage("ref_logprob") and Role.reference not in g.roles
        assert g.params["use_reference"] is False
    assert g.has_stage("values") is r.critic and g.has_stage("train_critic") is r.critic


def test_the_published_placements_and_presets():
    kl = {n: r.kl for n, r in RECIPES.items()}
    assert kl == {
        "grpo": "loss",
        "dr_grpo": "loss",
        "dapo": "none",
        "rloo": "reward",
        "reinforce_pp": "reward",
        "ppo": "reward",
    }
    d = recipe("dapo").defaults
    assert (d.clip_low, d.clip_high, d.dynamic_sampling, d.use_reference) == (
        0.2,
        0.28,
        True,
        False,
    )
    assert d.overlong_buffer == 4096 and d.loss_aggregation == "token_mean"
    assert recipe("dr_grpo").defaults.loss_aggregation == "seq_mean_token_sum"
    assert [n for n, r in RECIPES.items() if r.critic] == ["ppo"]
    assert {n for n, r in RECIPES.items() if r.group_baseline} == {
        "grpo",
        "dr_grpo",
        "dapo",
        "rloo",
    }
    assert all(r.sources for r in RECIPES.values())


def test_aliases_and_unknown_names():
    assert recipe("REINFORCE++").name == "reinforce_pp" and recipe("Dr.GRPO").name == "dr_grpo"
    assert build("dr-grpo").algorithm == "dr_grpo"
    with pytest.raises(UnknownRecipe) as e:
        recipe("a2c")
    assert "algorithm.name" in str(e.value) and "dr_grpo" in str(e.value)


@pytest.mark.parametrize("algo", ["Dr.GRPO", "dapo", "reinforce++"])
def test_search_takes_every_recipe(algo):
    """`rpeg plan --algo` names a recipe; the planning problem builds its graph with the
    config's group size (reinforce_pp's builder refused group_size before every builder
    took it)."""
    from rpeg.search.inputs import config_from_kwargs
    from rpeg.search.problem import problem_from_config

    cfg = config_from_kwargs({"algo": algo, "samples_per_prompt": 4})
    p = problem_from_config(cfg)
    assert p.base.algorithm == recipe(algo).name == cfg.algorithm.name
    assert p.base.params["group_size"] == 4
