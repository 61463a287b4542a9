"""Builders: the usual pipelines, their stages, fields, roles and options."""

import pytest

from rpeg.ir import (
    BUILDERS,
    Granularity,
    GraphError,
    Role,
    StageKind,
    build,
    builder_names,
    dapo,
    grpo,
    ppo,
    reinforce_pp,
    rloo,
    validate,
)

STANDARD = [k.value for k in StageKind]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_builder_is_valid_and_named_by_kind(name):
    g = build(name)
    assert validate(g) is g
    assert g.algorithm == name and g.name == name
    for s in g.stages:
        assert s.name == s.kind.value  # standard names = kind names
    assert g.staleness == 0
    assert g.topological_order()[0] == "generate"
    assert g.topological_order()[-1] == "sync_weights"
    # every consumed field is produced or a graph input
    for s in g.stages:
        for f in s.reads:
            assert f in g.inputs or f in g.producers


def test_grpo_has_no_critic_and_kl_in_loss():
    g = grpo()
    assert g.roles == {Role.actor, Role.reference}
    assert not g.stages_of_kind("values") and not g.stages_of_kind("train_critic")
    assert "ref_logprobs" in g.stage("train_actor").reads
    assert "ref_logprobs" not in g.stage("advantage").reads
    assert g.stage("advantage").writes == ("advantages",)
    assert g.stage("reward").role is None and "answers" in g.stage("reward").reads
    # one default per knob: the config's (rpeg.ir.recipes.KNOBS), KL off until asked for
    assert g.params["kl_coef"] == 0.0 and g.params["reward"] == "rule"
    assert g.params["kl_placement"] == "loss" and g.params["group_size"] == 8


def test_ppo_has_critic_gae_and_kl_in_reward():
    g = ppo(gamma=0.99, gae_lambda=0.9)
    assert g.roles == {Role.actor, Role.reference, Role.critic}
    assert g.stage("values").role == Role.critic
    assert set(g.stage("advantage").reads) >= {"rewards", "values", "ref_logprobs"}
    assert g.stage("advantage").writes == ("advantages", "returns")
    assert g.stage("train_critic").reads[-2:] == ("values", "returns")
    assert g.stage("train_critic").granularity == Granularity.minibatch
    assert g.params["gamma"] == 0.99 and g.params["gae_lambda"] == 0.9
    critic_edges = [e for e in g.state_edges if e.state == "critic_weights"]
    assert [(e.src, e.dst) for e in critic_edges] == [("train_critic", "values")]


@pytest.mark.parametrize("fn", [rloo, reinforce_pp])
def test_critic_free_kl_in_reward(fn):
    g = fn()
    assert Role.critic not in g.roles
    assert "ref_logprobs" in g.stage("advantage").reads
    assert "ref_logprobs" not in g.stage("train_actor").reads


def test_no_reference_drops_stage_and_kl():
    g = grpo(use_reference=False)
    assert not g.has_stage("ref_logprob")
    assert Role.reference not in g.roles
    assert g.params["kl_coef"] == 0.0
    assert "ref_logprobs" not in g.stage("train_actor").reads


def test_model_reward_uses_reward_model_role():
    g = ppo(reward="model")
    assert g.stage("reward").role == Role.reward_model
    assert "answers" not in g.stage("reward").reads
    assert g.inputs == ("prompts",)
    assert Role.reward_model in g.roles


def test_staleness_option_and_dapo_options():
    g = grpo(
        staleness=2,
        clip_high=0.28,
        dynamic_sampling=True,
        overlong_buffer=1024,
        loss_aggregation="seq_mean_token_sum",
    )
    assert g.staleness == 2
    assert g.params["clip_high"] == 0.28 and g.params["clip_low"] == 0.2
    assert g.params["dynamic_sampling"] is True and g.params["overlong_buffer"] == 1024
    assert g.params["loss_aggregation"] == "seq_mean_token_sum"
    d = dapo()
    assert not d.has_stage("ref_logprob") and d.params["clip_high"] == 0.28
    assert d.params["dynamic_sampling"] is True


def test_build_unknown_name_lists_allowed():
    with pytest.raises(GraphError) as e:
        build("a2c")
    msg = str(e.value)
    assert "unknown pipeline 'a2c'" in msg
    for n in builder_names():
        assert n in msg


def test_build_aliases_and_unknown_options():
    assert build("REINFORCE++").algorithm == "reinforce_pp"
    with pytest.raises(GraphError) as e:
        build("ppo", foo=1, bar=2)
    assert "ppo.bar" in str(e.value) and "ppo.foo" in str(e.value)


def test_bad_builder_options_all_reported():
    with pytest.raises(GraphError) as e:
        dapo(reward="llm", staleness=-1, kl_coef=0.1)
    assert len(e.value.problems) == 3
    msg = str(e.value)
    assert "'llm' is not one of rule, model" in msg
    assert "must be an integer >= 0, got -1" in msg
    assert "DAPO has no KL term" in msg and "dapo.kl_coef" in msg


def test_kl_placement_is_the_recipes_not_an_option():
    with pytest.raises(GraphError) as e:
        build("grpo", kl_placement="reward")
    assert "grpo.kl_placement" in str(e.value) and "unknown option" in str(e.value)


def test_invalid_param_values_rejected():
    with pytest.raises(GraphError) as e:
        ppo(gamma=1.5, loss_aggregation="sum", dual_clip=0.5)
    msg = str(e.value)
    assert "params.gamma" in msg and "params.loss_aggregation" in msg and "params.dual_clip" in msg


def test_graph_is_hashable_and_equal_when_rebuilt():
    assert ppo() == ppo() and hash(ppo()) == hash(ppo())
    assert ppo() != ppo(kl_coef=0.1)
    assert {grpo(), grpo(), rloo()} == {grpo(), rloo()}


def test_execution_units_and_edges():
    g = ppo()
    units = g.execution_units()
    assert [u.name for u in units] == g.topological_order()
    e = {(x.src, x.dst, x.field) for x in g.edges}
    assert ("generate", "reward", "responses") in e
    assert ("values", "advantage", "values") in e
    assert ("train_actor", "sync_weights", "actor_weights") in e
    assert all(x.granularity == Granularity.minibatch for x in g.edges if x.dst == "train_actor")


def test_stage_lookup_error_names_known_stages():
    with pytest.raises(GraphError) as e:
        grpo().stage("values")
    assert "no such stage" in str(e.value) and "generate" in str(e.value)
    assert grpo().group_of("generate") is None
