"""YAML round trips (property-based over builders + transforms) and loader error reports."""

import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg.ir import (
    BUILDERS,
    Graph,
    GraphError,
    bound_async,
    build,
    colocate,
    from_yaml,
    fuse,
    ppo,
    share_actor_critic,
    to_dict,
    to_yaml,
)

FUSIONS = [
    (("generate", "reward"), True),
    (("generate", "reward"), False),
    (("old_logprob", "ref_logprob"), False),
    (("ref_logprob", "old_logprob", "values"), False),
    (("advantage", "train_actor"), False),
    (("train_actor", "sync_weights"), False),
    (("train_critic", "sync_weights"), False),
]


@st.composite
def graphs(draw) -> Graph:
    name = draw(st.sampled_from(sorted(BUILDERS)))
    opts = {
        "use_reference": draw(st.booleans()),
        "reward": draw(st.sampled_from(["rule", "model"])),
        "clip_low": draw(st.floats(0.01, 0.5, allow_nan=False)),
        "multiturn": draw(st.booleans()),  # the env stage (docs/ir.md "Multi-turn: the env stage")
    }
    g = build(name, **opts)
    if draw(st.booleans()):
        with contextlib.suppress(GraphError):
            g = share_actor_critic(g)
    for stages, streaming in draw(st.lists(st.sampled_from(FUSIONS), max_size=3)):
        with contextlib.suppress(GraphError):
            g = fuse(g, stages, streaming=streaming)
    roles = sorted(r.value for r in g.roles)
    if len(roles) >= 2 and draw(st.booleans()):
        g = colocate(g, draw(st.lists(st.sampled_from(roles), min_size=2, max_size=3, unique=True)))
    return bound_async(g, draw(st.integers(0, 8)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_yaml_round_trip_is_exact(g):
    text = to_yaml(g)
    back = from_yaml(text)
    assert back == g and hash(back) == hash(g)
    assert to_yaml(back) == text
    assert back.execution_units() == g.execution_units()


def test_round_trip_through_file(tmp_path: Path):
    g = bound_async(fuse(share_actor_critic(ppo()), ["generate", "reward"], streaming=True), 2)
    p = tmp_path / "g.yaml"
    p.write_text(to_yaml(g))
    assert from_yaml(p) == g
    assert from_yaml(str(p)) == g


def test_malformed_yaml_names_the_line():
    with pytest.raises(GraphError) as e:
        from_yaml("name: x\nstages: [a, b\n")
    assert "malformed YAML" in str(e.value) and "line" in str(e.value)


def test_missing_file():
    with pytest.raises(GraphError, match="cannot read"):
        from_yaml("/nonexistent/graph.yaml")


def test_loader_reports_every_problem_with_location():
    d = to_dict(ppo())
    d["stages"][0]["kind"] = "rollout"
    d["stages"][1]["reads"].append("answer")
    d["stages"][2]["role"] = "judge"
    d["stages"][3]["colour"] = "red"
    d["state_edges"][0]["staleness"] = "one"
    d["fused"] = [{"name": "f", "stages": ["generate", "reward"], "streaming": "yes"}]
    d["colocated"] = [["actor", "teacher"]]
    d["extra"] = 1
    import yaml

    with pytest.raises(GraphError) as e:
        from_yaml(yaml.safe_dump(d))
    msg = str(e.value)
    assert len(e.value.problems) == 8, msg
    assert "stages[0] (generate).kind: unknown StageKind 'rollout'" in msg
    assert "stages[1] (reward).reads[4]: unknown field 'answer'" in msg
    assert "stages[2] (ref_logprob).role: unknown Role 'judge'" in msg
    assert "stages[3] (old_logprob).colour: unknown key" in msg
    assert "state_edges[0].staleness: must be an integer" in msg
    assert "fused[0].streaming: must be true or false" in msg
    assert "colocated[0][1]: unknown Role 'teacher'" in msg
    assert "extra: unknown key" in msg


def test_loader_runs_validate():
    d = to_dict(ppo())
    d["state_edges"][0]["staleness"] = -2
    import yaml

    with pytest.raises(GraphError, match="staleness must be >= 0, got -2"):
        from_yaml(yaml.safe_dump(d))


def test_top_level_must_be_mapping():
    with pytest.raises(GraphError, match="top level must be a mapping"):
        from_yaml("- a\n- b\n")
