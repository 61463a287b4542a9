"""``rpeg predict`` and ``rpeg bench`` of the plan ``rpeg plan`` wrote for a model known only by
its folder (issue 41, item 6): the plan names the folder ('model' here); the predictor reads
the folder's config.json from the run config beside the plan (or ``--config``), as
``rpeg specs add-model --from-hf`` would. Without a config naming the folder it is a named
refusal (exit 2), not "unknown model"."""

from __future__ import annotations

import json

import pytest
import yaml

from rpeg.cli import main


@pytest.fixture
def planned(user_files, tmp_path, capsys):
    cfg = tmp_path / "my.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": user_files["model"]}}))
    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(cfg), "--out", str(plan), "--max-candidates", "4"]) == 0
    capsys.readouterr()
    assert yaml.safe_load(plan.read_text())["model"] == "model"  # the folder's name
    from rpeg import specs

    # `rpeg predict` runs in a fresh process, which knows only the catalog (planning made the
    # folder's model known in this one)
    specs._RUN_MODELS.pop("model", None)
    return cfg, plan


def _weights_gb(capsys) -> float:
    d = json.loads(capsys.readouterr().out)
    return d["stages"]["train_actor"]["memory_gb"]["weights"]


def test_predict_reads_the_folder_from_the_config_beside_the_plan(planned, capsys):
    from tests.firstday.test_plan_user_model import TINY_QWEN_PARAMS

    _, plan = planned
    assert main(["predict", str(plan), "--json"]) == 0
    # the trainer's fp32 weights of the folder's model: its own size, not rpeg-tiny's
    assert _weights_gb(capsys) == pytest.approx(TINY_QWEN_PARAMS * 4 / 1e9, rel=1e-9)


def test_predict_with_the_users_config(planned, capsys, tmp_path):
    cfg, plan = planned
    alone = tmp_path / "alone"
    alone.mkdir()
    moved = alone / "plan.yaml"  # no plan.config.yaml beside it
    moved.write_text(plan.read_text())
    assert main(["predict", str(moved), "--config", str(cfg)]) == 0
    assert "step=" in capsys.readouterr().out


def test_a_folder_model_without_its_config_is_refused_by_name(planned, capsys, tmp_path):
    _, plan = planned
    alone = tmp_path / "alone2"
    alone.mkdir()
    moved = alone / "plan.yaml"
    moved.write_text(plan.read_text())
    assert main(["predict", str(moved)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "plan.model" in err and "'model' is not a catalog model" in err
    assert "--config" in err and "rpeg specs add-model --from-hf" in err


@pytest.mark.slow
def test_bench_runs_the_plan_of_a_folder_model(planned, capsys, tmp_path):
    _, plan = planned
    out = tmp_path / "bench"
    code = main(["bench", str(plan), "--steps", "2", "--no-artifact", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "| chosen: the plan given |" in text


def test_bench_refuses_a_plan_this_machine_cannot_run_before_starting(tmp_path, capsys):
    """A GPU cluster's plan (the README's 256-GH200 plan) is refused before a Prefect server or
    a run starts: one named refusal (exit 2), no run folder."""
    plan = tmp_path / "gpu-plan.yaml"
    flags = ["--model", "qwen2.5-7b", "--gpu", "h100", "--gpus", "8", "--max-candidates", "4"]
    assert main(["plan", *flags, "--out", str(plan)]) == 0
    capsys.readouterr()
    out = tmp_path / "bench"
    assert main(["bench", str(plan), "--no-artifact", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "run refused before anything started" in err and "cluster.name" in err
    assert not out.exists()


def test_predict_of_a_run_config_without_a_plan_names_how_to_plan_it(capsys):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[2] / "configs" / "builtin.yaml"
    assert main(["predict", str(cfg)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "a run config without a plan section" in err and f"rpeg plan {cfg} --out" in err


def test_bench_of_a_run_config_prices_the_folder_model(user_files, tmp_path, capsys, monkeypatch):
    """``rpeg bench my.yaml`` (a run config naming only model.path): the chosen plan is
    priced as the folder's model, not as the built-in tiny model compile's default plan
    names. The runs themselves are replaced by a stand-in (the slow test runs them)."""
    import rpeg.flows.bench as FB

    from rpeg.compile.sources import resolve
    from rpeg.perf import predict
    from rpeg.perf.calibration.run_lengths import configured_workload
    from rpeg.preflight import load_config

    cfg_path = tmp_path / "my.yaml"
    cfg_path.write_text(yaml.safe_dump({"model": {"path": user_files["model"]}}))
    seen = {}

    def stand_in(entries, steps, out, **kw):
        seen.update({e.name: e.predicted_s for e in entries})
        return [FB.BenchResult(e.name, e.description, e.predicted_s, 1.0) for e in entries]

    monkeypatch.setattr(FB, "run_entries", stand_in)
    out = tmp_path / "bench"
    assert main(["bench", str(cfg_path), "--no-artifact", "--out", str(out)]) == 0
    cfg = load_config(str(cfg_path))
    graph, default = resolve(None, cfg)
    wl = configured_workload(cfg, default.cluster)
    as_folder = predict(graph, default.model_copy(update={"model": "model"}), wl).step_s
    as_tiny = predict(graph, default, wl).step_s
    assert default.model == "rpeg-tiny" and abs(as_folder - as_tiny) > 0.05 * as_tiny
    assert seen["chosen"] == pytest.approx(as_folder, rel=1e-9)
    assert yaml.safe_load((out / "chosen.plan.yaml").read_text())["model"] == "model"
