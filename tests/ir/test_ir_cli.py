"""`rpeg graph show|validate|render`: output and exit codes."""

from rpeg.cli import main
from rpeg.ir import from_yaml, ppo, to_dict, to_yaml, visual


def test_show_table(capsys):
    assert (
        main(
            [
                "graph",
                "show",
                "ppo",
                "--share",
                "--fuse",
                "generate,reward",
                "--streaming",
                "-k",
                "2",
                "--colocate",
                "actor,reference",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "staleness k=2" in out and "shared actor-critic" in out
    for s in (
        "generate",
        "old_logprob",
        "train_actor",
        "sync_weights",
        "generate+reward (streaming)",
    ):
        assert s in out
    assert "train_critic" not in out
    assert "colocated: actor+reference" in out


def test_validate_ok_and_problems(capsys, tmp_path):
    assert main(["graph", "validate", "grpo"]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    assert main(["graph", "validate", "grpo", "--share"]) == 2
    err = capsys.readouterr().err
    assert "invalid graph" in err and "has no critic" in err and "Traceback" not in err
    bad = to_dict(ppo())
    bad["stages"][0]["kind"] = "rollout"
    bad["stages"][1]["role"] = "judge"
    import yaml

    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(bad))
    assert main(["graph", "validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert (
        "2 problems" in err
        and "unknown StageKind 'rollout'" in err
        and "unknown Role 'judge'" in err
    )


def test_unknown_source_and_bad_transform(capsys):
    assert main(["graph", "show", "a3c"]) == 2
    assert (
        "not a builder name (grpo, dr_grpo, dapo, rloo, reinforce_pp, ppo)"
        in capsys.readouterr().err
    )
    assert main(["graph", "validate", "grpo", "--staleness", "-1"]) == 2
    assert "staleness k must be an integer >= 0" in capsys.readouterr().err
    assert main(["graph", "validate", "grpo", "--fuse", "generate,train_actor"]) == 2
    assert "not contiguous" in capsys.readouterr().err
    assert main(["graph", "validate", "grpo", "-o", "reward=llm"]) == 2
    assert "'llm' is not one of rule, model" in capsys.readouterr().err


def test_builder_options(capsys):
    assert (
        main(
            [
                "graph",
                "render",
                "grpo",
                "-f",
                "yaml",
                "-o",
                "use_reference=false",
                "-o",
                "clip_high=0.28",
            ]
        )
        == 0
    )
    g = from_yaml(capsys.readouterr().out)
    assert not g.has_stage("ref_logprob") and g.params["clip_high"] == 0.28


def test_render_text_formats(capsys, tmp_path):
    assert main(["graph", "render", "ppo", "--format", "mermaid"]) == 0
    assert capsys.readouterr().out.startswith("flowchart LR")
    out = tmp_path / "g.dot"
    assert main(["graph", "render", "ppo", "--out", str(out)]) == 0
    assert out.read_text().startswith('digraph "ppo"')
    y = tmp_path / "g.yaml"
    assert main(["graph", "render", "ppo", "--share", "--out", str(y)]) == 0
    assert from_yaml(y) == from_yaml(to_yaml(from_yaml(y)))
    assert main(["graph", "show", str(y)]) == 0
    assert "shared actor-critic" in capsys.readouterr().out
    assert main(["graph", "render", "ppo", "--format", "jpeg"]) == 2
    assert "'jpeg' is not one of dot, mermaid, png, svg, yaml" in capsys.readouterr().err


def test_render_png_without_graphviz_is_refused(capsys, tmp_path, monkeypatch):
    """No picture can be drawn: a named refusal (exit 2) saying what to install or write
    instead, not other files written in its place (issue 41, Low)."""
    monkeypatch.setattr(visual, "has_graphviz", lambda: False)
    out = tmp_path / "g.png"
    assert main(["graph", "render", "ppo", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--out: a PNG picture needs Graphviz" in err and "install graphviz" in err
    assert f"--out {tmp_path / 'g'}.dot" in err
    assert not list(tmp_path.iterdir())


def test_render_png_with_graphviz(capsys, tmp_path):
    import pytest

    if not visual.has_graphviz():
        pytest.skip("graphviz `dot` not installed")
    out = tmp_path / "g.svg"
    assert main(["graph", "render", "ppo", "--share", "--out", str(out)]) == 0
    assert out.read_text().lstrip().startswith("<?xml")
