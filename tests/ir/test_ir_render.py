"""DOT / Mermaid text and render() with and without Graphviz."""

from rpeg.ir import bound_async, fuse, ppo, render, share_actor_critic, to_dot, to_mermaid, visual


def _example():
    g = share_actor_critic(ppo())
    g = fuse(g, ["generate", "reward"], streaming=True, name="rollout")
    return bound_async(g, 1)


def test_dot_has_clusters_roles_and_dashed_state_edges():
    dot = to_dot(_example())
    assert dot.startswith('digraph "ppo"')
    assert "subgraph cluster_0" in dot and "fused: rollout (streaming)" in dot
    assert '"sync_weights" -> "generate" [style=dashed' in dot and "weights k=1" in dot
    assert "penwidth=2.5" in dot  # sample-level edge inside the streaming group
    assert visual.ROLE_COLORS[None] in dot and "reference" in dot
    assert '"train_actor" -> "sync_weights" [label="actor_weights"]' in dot


def test_mermaid_text():
    mm = to_mermaid(_example())
    assert mm.startswith("flowchart LR")
    assert 'subgraph g0["fused: rollout (streaming)"]' in mm
    assert "s_sync_weights -.->|weights k=1| s_generate" in mm
    assert "s_generate ==>|responses, response_mask| s_reward" in mm


def test_render_writes_text_always_and_images_with_dot(tmp_path, monkeypatch):
    monkeypatch.setattr(visual, "has_graphviz", lambda: False)
    written = render(_example(), tmp_path / "g.png")
    assert sorted(p.name for p in written) == ["g.dot", "g.mmd"]
    assert (tmp_path / "g.mmd").read_text().startswith("flowchart LR")


def test_render_images_when_graphviz_present(tmp_path):
    import pytest

    if not visual.has_graphviz():
        pytest.skip("graphviz `dot` not installed")
    written = render(_example(), tmp_path / "sub" / "g")
    names = sorted(p.name for p in written)
    assert names == ["g.dot", "g.mmd", "g.png", "g.svg"]
    assert (tmp_path / "sub" / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_doc_picture_source_is_current():
    from pathlib import Path

    from rpeg.ir import colocate

    g = share_actor_critic(ppo(name="ppo-shared-fused"))
    g = fuse(g, ["generate", "reward"], streaming=True, name="rollout")
    g = fuse(g, ["old_logprob", "ref_logprob"], name="forward")
    g = bound_async(colocate(g, ["actor", "reference"]), 1)
    doc = Path(__file__).resolve().parents[2] / "docs" / "img" / "ppo_shared_fused.dot"
    assert doc.read_text() == to_dot(g), "re-render docs/img (see docs/ir.md)"
