"""validate(): every problem is reported at once, each naming its stage/field/edge/group."""

import dataclasses

import pytest

from rpeg import ir
from rpeg.ir import FusedGroup, Graph, GraphError, Role, Stage, StateEdge, grpo, ppo


def problems(g: Graph) -> list[str]:
    with pytest.raises(GraphError) as e:
        ir.validate(g)
    assert str(e.value).startswith("invalid graph (")
    return [str(p) for p in e.value.problems]


def _has(msgs: list[str], *parts: str) -> bool:
    return any(all(p in m for p in parts) for m in msgs)


def test_valid_graph_has_no_problems():
    assert ir.problems(grpo()) == []


def test_many_problems_reported_together():
    g = grpo()
    stages = list(g.stages)
    # advantage reads a field nobody writes; reward gets a role not allowed for its kind
    stages[4] = dataclasses.replace(stages[4], reads=(*stages[4].reads, "values"))
    stages[1] = dataclasses.replace(stages[1], role=Role.critic)
    bad = dataclasses.replace(
        g,
        stages=tuple(stages),
        state_edges=(StateEdge("sync_weights", "generate", "weights", -1),),
        fused=(FusedGroup("f", ("generate", "nope")),),
        colocated=(frozenset({Role.actor, Role.reward_model}),),
        shared_actor_critic=True,
    )
    msgs = problems(bad)
    assert _has(msgs, "stage advantage.reads", "field 'values' is consumed but never produced")
    assert _has(msgs, "stage reward.role", "role critic is not allowed for a reward stage")
    assert _has(msgs, "state_edges[0]", "staleness must be >= 0, got -1")
    assert _has(msgs, "fused f", "unknown stage 'nope'")
    assert _has(msgs, "colocated[0]", "dangling role 'reward_model'")
    assert _has(msgs, "shared_actor_critic", "no critic")
    assert len(msgs) >= 6


def test_cycle_within_a_step():
    g = grpo()
    stages = [
        dataclasses.replace(s, reads=(*s.reads, "actor_weights")) if s.name == "advantage" else s
        for s in g.stages
    ]
    msgs = problems(dataclasses.replace(g, stages=tuple(stages)))
    assert _has(msgs, "cycle within a step", "train_actor", "advantage", "actor_weights")
    with pytest.raises(GraphError, match="cycle within a step"):
        dataclasses.replace(g, stages=tuple(stages)).execution_units()


def test_self_read_and_duplicate_writers():
    g = grpo()
    extra = Stage("reward2", "reward", None, ("responses", "rewards"), ("rewards",))
    msgs = problems(dataclasses.replace(g, stages=(*g.stages, extra)))
    assert _has(msgs, "field rewards", "written by more than one stage: reward, reward2")
    assert _has(msgs, "stage reward2", "reads and writes the same field 'rewards'")


def test_unknown_fields_and_duplicate_stage_names():
    g = grpo()
    extra = Stage("generate", "generate", "actor", ("prompt",), ("tokens",))
    msgs = problems(dataclasses.replace(g, stages=(*g.stages, extra)))
    assert _has(msgs, "stage generate", "duplicate stage name")
    assert _has(msgs, "stage generate.reads", "unknown field 'prompt'")
    assert _has(msgs, "stage generate.writes", "unknown field 'tokens'")


def test_inconsistent_staleness_and_state_edge_endpoints():
    g = grpo()
    edges = (
        StateEdge("sync_weights", "generate", "weights", 0),
        StateEdge("train_actor", "generate", "weights", 2),
        StateEdge("train_actor", "reward", "weights", 2),
        StateEdge("ghost", "generate", "weights", 2),
    )
    msgs = problems(dataclasses.replace(g, state_edges=edges))
    assert _has(msgs, "state_edges", "inconsistent staleness on the weights edges")
    assert _has(msgs, "state_edges[2]", "weights must go to a generate stage, not a reward stage")
    assert _has(msgs, "state_edges[3]", "unknown stage 'ghost'")


def test_missing_weights_edge_and_missing_stages():
    g = dataclasses.replace(grpo(), state_edges=())
    assert _has(problems(g), "no 'weights' state edge into generate")
    empty = Graph("empty", "none", ())
    msgs = problems(empty)
    assert _has(msgs, "no generate stage") and _has(msgs, "no train_actor stage")


def test_fused_group_problems():
    g = grpo()
    groups = (
        FusedGroup("a", ("generate", "reward")),
        FusedGroup("b", ("reward", "advantage", "advantage")),
        FusedGroup("c", ("old_logprob",)),
        FusedGroup("s", ("reward", "advantage"), streaming=True),
    )
    msgs = problems(dataclasses.replace(g, fused=groups))
    assert _has(msgs, "fused b", "stage 'reward' is already in fused group 'a'")
    assert _has(msgs, "fused b", "stage 'advantage' listed 2 times")
    assert _has(msgs, "fused c", "needs at least 2 stages")
    assert _has(msgs, "fused s", "streaming needs the group to start with generate")


def test_params_consistency_with_stages():
    g = dataclasses.replace(
        grpo(), params=grpo().params.replace(reward="model", use_reference=False)
    )
    msgs = problems(g)
    assert _has(msgs, "params.reward", "does not use role reward_model")
    assert _has(msgs, "params.use_reference", "has ref_logprob stage")


def test_shared_graph_may_not_use_critic_role():
    g = dataclasses.replace(ppo(), shared_actor_critic=True)
    msgs = problems(g)
    assert _has(
        msgs, "stage train_critic.role", "uses role critic although actor and critic are shared"
    )


def test_values_stage_may_use_actor_when_shared():
    from rpeg.ir import share_actor_critic

    s = share_actor_critic(ppo())
    stages = list(s.stages) + [Stage("values", "values", "actor", ("responses",), ())]
    assert ir.problems(dataclasses.replace(s, stages=tuple(stages))) == []
    assert _has(
        problems(
            dataclasses.replace(
                ppo(),
                stages=tuple(
                    dataclasses.replace(x, role=Role.actor) if x.name == "values" else x
                    for x in ppo().stages
                ),
            )
        ),
        "stage values.role",
        "allowed: critic",
    )


def test_params_must_be_scalars():
    with pytest.raises(GraphError, match="params.x: value must be a scalar"):
        grpo().params.replace(x=[1, 2])


def test_execution_units_of_a_non_convex_fusion_name_the_cycle():
    # generate -> reward -> advantage: fusing the two ends without reward makes the unit graph
    # cyclic (x -> reward -> x); execution_units refuses it without needing rpeg.ir.checks
    g = dataclasses.replace(grpo(), fused=(FusedGroup("x", ("generate", "advantage")),))
    with pytest.raises(GraphError) as e:
        g.execution_units()
    msg = str(e.value)
    assert "execution units form a cycle within a step: x -> " in msg
    assert msg.rstrip().endswith("-> x")
    assert any(k in msg for k in ("reward", "ref_logprob", "old_logprob"))
