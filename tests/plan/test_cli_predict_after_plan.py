"""`rpeg plan --out P.yaml` then `rpeg predict P.yaml` prices the plan on the planned workload."""

import json

from rpeg.cli import main

FLAGS = [
    "plan", "--model", "qwen2.5-7b", "--gpu", "gh200", "--gpus", "8", "--algo", "grpo",
    "--num-prompts", "64", "--samples-per-prompt", "8", "--max-response-tokens", "2048",
]  # fmt: skip


def _predict(args, capsys) -> dict:
    assert main(["predict", *args, "--json"]) == 0
    captured = capsys.readouterr()
    return {"pred": json.loads(captured.out), "err": captured.err}


def test_predict_finds_the_plans_config_beside_it(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main([*FLAGS, "--out", str(out), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["predicted_step_s"]
    auto = _predict([str(out)], capsys)
    assert "workload from" in auto["err"]
    explicit = _predict([str(out), "--config", str(tmp_path / "plan.config.yaml")], capsys)
    assert auto["pred"]["step_s"] == explicit["pred"]["step_s"]
    assert abs(auto["pred"]["step_s"] - planned) <= 1e-6 * planned


def test_predict_without_any_config_warns(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main([*FLAGS, "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    (tmp_path / "plan.config.yaml").unlink()
    assert "warning: no --config" in _predict([str(out)], capsys)["err"]
