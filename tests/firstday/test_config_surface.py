"""The config surface a Hydra / NeMo-RL user expects: dotted overrides after the config,
`rpeg config show`, docs/config.md generated from the schema, the README's quickstart."""

import json
import re
from pathlib import Path

import pytest
import yaml

from rpeg.cli.overrides import parse_overrides, split_config_and_overrides
from rpeg.errors import ConfigError
from tests.firstday.conftest import run_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_override_values_are_typed_like_yaml():
    got = parse_overrides(
        ["algorithm.kl_coef=0.01", "runtime.steps=2", "runtime.resume=true", "model.path=null"]
        + ["task.rewards=[exact_numeric, format]", "task.system_prompt=Think step by step."]
    )
    assert got == {
        "algorithm.kl_coef": 0.01,
        "runtime.steps": 2,
        "runtime.resume": True,
        "model.path": None,
        "task.rewards": ["exact_numeric", "format"],
        "task.system_prompt": "Think step by step.",
    }
    # no config file given: the first argument is an override
    assert split_config_and_overrides("runtime.steps=3", []) == (None, {"runtime.steps": 3})
    with pytest.raises(ConfigError) as ei:
        parse_overrides(["runtime.steps", "=3"])
    assert [p.where for p in ei.value.problems] == ["runtime.steps", "=3"]


def test_a_bad_override_is_a_named_field_error_before_start(user_files, tmp_path, capsys):
    from rpeg.cli import main

    cfg = run_yaml(user_files, tmp_path)
    code = main(["train", cfg, "--local", "runtime.stepz=2", "algorithm.kl_coef=lots"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "runtime.stepz: unknown field" in err
    assert "algorithm.kl_coef: Input should be a valid number" in err
    assert not (tmp_path / "out").exists()  # nothing started


def test_train_with_dotted_overrides(user_files, tmp_path, capsys):
    """`rpeg train cfg.yaml algorithm.kl_coef=0.01 runtime.steps=2` (the issue's command)."""
    from rpeg.cli import main

    cfg = run_yaml(user_files, tmp_path)
    code = main(["train", cfg, "algorithm.kl_coef=0.01", "runtime.steps=2", "--local"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = (tmp_path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # runtime.steps=2 overrode the file's default of 60
    assert "done: 2 steps" in out


def test_config_show_merges_file_overrides_and_defaults(user_files, tmp_path, capsys):
    from rpeg.cli import main

    cfg = run_yaml(user_files, tmp_path)
    assert main(["config", "show", cfg, "runtime.steps=7"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["runtime"]["steps"] == 7  # the override
    assert shown["task"]["answer_key"] == "reward_model.ground_truth"  # the file
    assert shown["algorithm"]["clip_low"] == 0.2  # a default
    assert shown["task"]["chat_template"] == "auto"


def test_config_docs_are_generated_from_the_schema():
    """docs/config.md is stale when this fails: regenerate it with `rpeg config docs`."""
    from rpeg.cli.config_docs import render_config_docs

    text = (ROOT / "docs" / "config.md").read_text()
    assert text == render_config_docs(), "docs/config.md is stale: run `rpeg config docs`"
    assert "| `task.answer_key` |" in text and "| `runtime.log_samples_every` |" in text


def _readme_blocks():
    text = (ROOT / "README.md").read_text()
    part = text.split("## Your Hugging Face model + your Parquet", 1)[1].split("\n## ", 1)[0]
    y = re.search(r"```yaml\n(.*?)```", part, re.S).group(1)
    sh = re.search(r"```bash\n(.*?)```", part, re.S).group(1)
    cmds = [line.split("#", 1)[0].split() for line in sh.splitlines() if line.strip()]
    return y, cmds


def test_readme_quickstart_your_model_your_parquet(user_files, tmp_path, monkeypatch, capsys):
    """The README's quickstart as written, on a tiny Qwen2 model with a chat template and a
    verl Parquet built here (their paths put where the README's are)."""
    from rpeg.cli import main

    y, cmds = _readme_blocks()
    model_path = yaml.safe_load(y)["model"]["path"]
    data_url = yaml.safe_load(y)["task"]["url"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(
        y.replace(model_path, user_files["model"]).replace(data_url, user_files["verl"])
    )
    ran = []
    for cmd in cmds:
        assert cmd[0] == "rpeg"
        if cmd[1] == "train" and "--local" not in cmd:
            continue  # the distributed run: tests/firstday/test_first_day_distributed.py
        args = [user_files["model"] if a == model_path else a for a in cmd[1:]]
        assert main(args) == 0, capsys.readouterr()
        ran.append(cmd[1])
    assert ran == ["config", "train", "export"]
    out = capsys.readouterr().out
    assert "chat template applied" in out and "done: 2 steps" in out
    text = (tmp_path / "runs/my/latest/samples.jsonl").read_text()  # the run's folder
    samples = [json.loads(s) for s in text.splitlines()]
    assert {s["step"] for s in samples} == {1, 2}
    from transformers import AutoModelForCausalLM

    assert (
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "my-model-rl"), trust_remote_code=False)
        is not None
    )


def test_done_line_counts_the_steps_of_this_call_after_resume(user_files, tmp_path, capsys):
    """After `--resume` of 2 remaining steps the last line says 2 steps, not the run's 4."""
    from rpeg.cli import main

    cfg = run_yaml(user_files, tmp_path, runtime={"checkpoint_every": 1})
    assert main(["train", cfg, "--local", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "done: 2 steps in" in out
    # stdout is not a terminal here: one line per step (issue 29 item 5), no bar
    assert [f"step {i}/2: reward" in out for i in (1, 2)] == [True, True]
    assert main(["train", cfg, "--local", "--steps", "4", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "step 3/4: reward" in out and "step 1/4" not in out
    assert "done: 2 steps (now 4 in all)" in out, out[-600:]
    assert len((tmp_path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()) == 4
