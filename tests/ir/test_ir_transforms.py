"""Structural transforms: each returns a new valid graph or refuses with the reason."""

import pytest

from rpeg.ir import (
    FusedGroup,
    Granularity,
    GraphError,
    Role,
    Stage,
    bound_async,
    colocate,
    fuse,
    grpo,
    ppo,
    separate,
    share_actor_critic,
    unfuse,
)


def test_bound_async_sets_k_and_is_pure():
    g = grpo()
    h = bound_async(g, 3)
    assert h.staleness == 3 and g.staleness == 0
    assert [e.staleness for e in h.state_edges if e.state == "weights"] == [3]
    # critic edge stays on-policy
    p = bound_async(ppo(), 2)
    assert {e.state: e.staleness for e in p.state_edges} == {"weights": 2, "critic_weights": 0}


@pytest.mark.parametrize("k", [-1, 1.5, True, "2"])
def test_bound_async_refuses_bad_k(k):
    with pytest.raises(GraphError, match="staleness k must be an integer >= 0"):
        bound_async(grpo(), k)


def test_share_actor_critic_merges_forward_and_update():
    g = ppo()
    s = share_actor_critic(g)
    assert s.shared_actor_critic and not g.shared_actor_critic
    assert not s.has_stage("values") and not s.has_stage("train_critic")
    fwd = s.stage("old_logprob")
    assert fwd.role == Role.actor and fwd.writes == ("old_logprobs", "values")
    upd = s.stage("train_actor")
    assert {"values", "returns", "advantages"} <= set(upd.reads)
    assert upd.writes == ("actor_weights",)
    assert Role.critic not in s.roles
    assert [e.state for e in s.state_edges] == ["weights"]
    assert len(s.stages) == len(g.stages) - 2


def test_share_refused_without_critic_or_twice():
    with pytest.raises(GraphError, match="the grpo graph has no critic"):
        share_actor_critic(grpo())
    with pytest.raises(GraphError, match="already shared"):
        share_actor_critic(share_actor_critic(ppo()))


def test_share_rewrites_groups_and_colocation():
    g = colocate(fuse(ppo(), ["old_logprob", "values"], name="fwd"), ["critic", "reference"])
    s = share_actor_critic(g)
    assert s.fused == ()  # the group collapsed to one stage
    assert s.colocated == (frozenset({Role.actor, Role.reference}),)
    g2 = fuse(ppo(), ["ref_logprob", "old_logprob", "values"], name="fwd")
    assert share_actor_critic(g2).group("fwd").stages == ("ref_logprob", "old_logprob")


def test_fuse_records_group_and_streaming_edges():
    g = fuse(grpo(), ["generate", "reward"], streaming=True)
    grp = g.group("generate+reward")
    assert grp == FusedGroup("generate+reward", ("generate", "reward"), True)
    assert g.group_of("reward") is grp
    gen_to_reward = [e for e in g.edges if e.src == "generate" and e.dst == "reward"]
    assert gen_to_reward and all(e.granularity == Granularity.sample for e in gen_to_reward)
    other = [e for e in g.edges if e.src == "generate" and e.dst != "reward"]
    assert all(e.granularity != Granularity.sample for e in other)
    units = g.execution_units()
    assert units[0] is grp and isinstance(units[1], Stage)


def test_fuse_parallel_stages_contiguous():
    g = fuse(ppo(), "ref_logprob,old_logprob,values", name="forwards")
    order = g.topological_order()
    i = order.index("ref_logprob")
    assert order[i : i + 3] == ["ref_logprob", "old_logprob", "values"]
    assert [getattr(u, "name", None) for u in g.execution_units()].count("forwards") == 1


def test_fuse_refusals():
    with pytest.raises(
        GraphError, match="not contiguous: reward, ref_logprob, old_logprob, advantage"
    ):
        fuse(grpo(), ["generate", "train_actor"])
    with pytest.raises(GraphError, match="'reward' depends on 'generate' but is listed before it"):
        fuse(grpo(), ["reward", "generate"])
    with pytest.raises(GraphError, match="streaming needs the group to start with generate"):
        fuse(grpo(), ["old_logprob", "advantage"], streaming=True)
    with pytest.raises(GraphError, match="at least 2 stages"):
        fuse(grpo(), ["generate"])
    g = fuse(grpo(), ["generate", "reward"])
    with pytest.raises(GraphError, match="already in fused group 'generate\\+reward'"):
        fuse(g, ["reward", "advantage"])


def test_fuse_reports_all_unknown_stages():
    with pytest.raises(GraphError) as e:
        fuse(grpo(), ["values", "generate", "train_critic"])
    msgs = [str(p) for p in e.value.problems]
    assert len(msgs) == 2
    assert "unknown stage 'values'" in msgs[0] and "unknown stage 'train_critic'" in msgs[1]


def test_unfuse():
    g = fuse(grpo(), ["generate", "reward"], name="r")
    assert unfuse(g, "r") == grpo()
    with pytest.raises(GraphError, match="no such group"):
        unfuse(g, "nope")


def test_colocate_and_separate():
    g = colocate(ppo(), ["actor", "reference"])
    assert g.colocated == (frozenset({Role.actor, Role.reference}),)
    g2 = colocate(g, "critic,actor")  # overlapping sets merge
    assert g2.colocated == (frozenset({Role.actor, Role.reference, Role.critic}),)
    assert g2.colocated_with("critic") == {Role.actor, Role.reference, Role.critic}
    g3 = separate(g2, Role.critic)
    assert g3.colocated == (frozenset({Role.actor, Role.reference}),)
    assert separate(g3, "reference").colocated == ()


def test_colocate_refusals():
    with pytest.raises(GraphError) as e:
        colocate(grpo(), ["actor", "critic", "judge"])
    msg = str(e.value)
    assert "unknown role 'judge'" in msg and "role 'critic' is not used by any stage" in msg
    with pytest.raises(GraphError, match="at least 2 distinct roles"):
        colocate(grpo(), ["actor"])


def test_compose_share_fuse_bound():
    g = ppo()
    g = share_actor_critic(g)
    g = fuse(g, ["generate", "reward"], streaming=True, name="rollout")
    g = fuse(g, ["old_logprob", "ref_logprob"], name="forward")
    g = colocate(g, ["actor", "reference"])
    g = bound_async(g, 1)
    assert g.staleness == 1 and g.shared_actor_critic
    names = [u.name for u in g.execution_units()]
    assert names == ["rollout", "forward", "advantage", "train_actor", "sync_weights"]


def test_refused_compositions():
    s = share_actor_critic(ppo())
    with pytest.raises(GraphError, match="unknown stage 'values'"):
        fuse(s, ["old_logprob", "values"])
    with pytest.raises(GraphError, match="role 'critic' is not used"):
        colocate(s, ["actor", "critic"])
    with pytest.raises(GraphError):
        bound_async(fuse(s, ["generate", "reward"]), -1)
    # fusing then sharing can put the merged forward in two groups: refused with the reason
    f = fuse(
        fuse(ppo(), ["old_logprob", "ref_logprob"], name="fwd"), ["values", "advantage"], name="va"
    )
    with pytest.raises(
        GraphError, match="fused va: stage 'old_logprob' is already in fused group 'fwd'"
    ):
        share_actor_critic(f)
