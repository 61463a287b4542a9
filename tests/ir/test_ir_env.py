"""The env stage of multi-turn graphs (docs/ir.md "Multi-turn: the env stage"): built with
``multiturn=True`` (or from a config with task.multiturn.env), fused with generate in one
unit, the generate <-> env loop as a next-turn edge that is no dependency, checks, YAML,
pictures and ``rpeg graph show``."""

import dataclasses

import pytest
from typer.testing import CliRunner

from rpeg import ir
from rpeg.ir import GraphError, StageKind


def test_multiturn_builder_adds_the_env_stage_in_the_rollout_unit():
    g = ir.build("grpo", multiturn=True)
    env = g.stage("env")
    assert env.kind == StageKind.env and env.role is None
    assert env.reads == ("actions",) and env.writes == ("observations",)
    assert g.stage("generate").reads == ("prompts", "observations")
    assert "actions" in g.stage("generate").writes
    assert g.group_of("env").stages == ("generate", "env")
    units = [u.name for u in g.execution_units()]
    assert units[0] == "generate+env" and "env" not in units and "generate" not in units
    # the loop: generate -> env (actions, per sample), env -> generate (the next turn)
    (turn,) = [e for e in g.edges if e.next_turn]
    assert (turn.src, turn.dst, turn.field) == ("env", "generate", "observations")
    assert not g.dag().has_edge("env", "generate")  # no dependency: no cycle
    assert g.dag().has_edge("generate", "env")
    assert g.topological_order()[:2] == ["generate", "env"]
    # the builder option is the graph's shape, not an algorithm parameter
    assert "multiturn" not in g.params


def test_single_turn_graphs_have_no_env_stage():
    g = ir.build("grpo")
    assert g.env_stages == () and not any(e.next_turn for e in g.edges)
    assert "observations" not in g.stage("generate").reads


def test_env_stage_must_be_fused_with_its_generate_stage():
    g = ir.build("ppo", multiturn=True)
    with pytest.raises(GraphError, match="an env stage runs between the turns of generate"):
        ir.validate(g.replace(fused=()))


def test_only_generate_reads_observations():
    g = ir.build("grpo", multiturn=True)
    bad = tuple(
        dataclasses.replace(s, reads=(*s.reads, "observations")) if s.name == "reward" else s
        for s in g.stages
    )
    with pytest.raises(GraphError, match="only generate reads it"):
        ir.validate(g.replace(stages=bad))


def test_transforms_keep_the_env_stage():
    g = ir.share_actor_critic(ir.bound_async(ir.build("ppo", multiturn=True), 2))
    assert g.staleness == 2 and g.group_of("env").stages == ("generate", "env")
    g = ir.fuse(g, ["ref_logprob", "old_logprob"], name="forward")
    assert [u.name for u in g.execution_units()][:2] == ["generate+env", "reward"]
    # generate is already in the rollout loop: fusing it with reward is refused
    with pytest.raises(GraphError, match="already in fused group"):
        ir.fuse(g, ["generate", "reward"], streaming=True)


def test_yaml_round_trip_and_pictures():
    g = ir.build("grpo", multiturn=True)
    assert ir.from_yaml(ir.to_yaml(g)) == g
    dot = ir.to_dot(g)
    assert '"env" -> "generate"' in dot and "observations (next turn)" in dot
    assert '"generate" -> "env" [label="actions (per sample)"' in dot
    assert "s_env -.->|observations next turn| s_generate" in ir.to_mermaid(g)


def test_graph_from_config_and_graph_show_of_a_config_file():
    from rpeg.cli import app
    from rpeg.compile import graph_from_config
    from rpeg.config import RunConfig

    g = graph_from_config(RunConfig.from_yaml("configs/tool-cpu.yaml"))
    assert [s.name for s in g.env_stages] == ["env"]
    assert graph_from_config(RunConfig()).env_stages == ()
    res = CliRunner().invoke(
        app, ["graph", "show", "configs/tool-cpu.yaml"], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    assert "generate+env" in res.output
    assert "turn loop: env -> generate (observations, the next turn)" in res.output
