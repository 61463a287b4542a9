"""RunConfig: defaults, YAML round trip, every error reported at once, shipped configs valid."""

from pathlib import Path

import pytest
import yaml

from rpeg.config import RunConfig
from rpeg.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_defaults_round_trip_through_yaml():
    cfg = RunConfig()
    again = RunConfig.from_yaml(cfg.to_yaml())
    assert again == cfg
    assert (
        cfg.workload.samples_per_step == cfg.workload.num_prompts * cfg.workload.samples_per_prompt
    )


def test_every_problem_is_reported_at_once_with_field_and_allowed_values():
    bad = {
        "algorithm": {"name": "dpo", "kl_estimator": "k9"},
        "workload": {"num_prompts": 0},
        "runtime": {"stepz": 3},
    }
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(bad)
    err = info.value
    wheres = {p.where for p in err.problems}
    assert {
        "algorithm.name",
        "algorithm.kl_estimator",
        "workload.num_prompts",
        "runtime.stepz",
    } <= wheres
    text = str(err)
    assert "'grpo'" in text and "'ppo'" in text  # allowed values are named
    assert "unknown field" in text
    assert "4 problems" in text


def test_cross_field_rule_names_both_fields():
    with pytest.raises(ConfigError, match="train_minibatches=3 must divide"):
        RunConfig.from_dict(
            {"workload": {"num_prompts": 2, "samples_per_prompt": 2, "train_minibatches": 3}}
        )


def test_file_task_needs_url():
    with pytest.raises(ConfigError, match="needs url"):
        RunConfig.from_dict({"task": {"kind": "jsonl"}})


def test_overrides_are_dotted_and_validated():
    cfg = RunConfig().with_overrides({"runtime.steps": 5, "algorithm.name": "ppo"})
    assert cfg.runtime.steps == 5 and cfg.algorithm.name == "ppo"
    with pytest.raises(ConfigError) as info:
        RunConfig().with_overrides({"nosuch.steps": 1, "runtime.steps": -1})
    # every problem at once: the unknown section and the bad value
    assert [p.where for p in info.value.problems] == ["nosuch.steps", "runtime.steps"]
    with pytest.raises(ConfigError, match="runtime.steps"):
        RunConfig().with_overrides({"runtime.steps": -1})


def test_malformed_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        RunConfig.from_yaml("model: [unclosed\n")
    with pytest.raises(ConfigError, match="file not found"):
        RunConfig.from_yaml(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a folder") as info:
        RunConfig.from_yaml(tmp_path)
    assert info.value.problems[0].where == str(tmp_path)
    with pytest.raises(ConfigError, match="mapping"):
        RunConfig.from_yaml("- a\n- b\n")


def test_fsspec_url(tmp_path):
    import fsspec

    with fsspec.open("memory://cfg/run.yaml", "w") as fh:
        fh.write("runtime: {steps: 7}\n")
    assert RunConfig.from_yaml("memory://cfg/run.yaml").runtime.steps == 7


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("**/*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    data = yaml.safe_load(path.read_text())
    if isinstance(data, dict) and data.get("kind") == "plan":
        pytest.skip("plan files are validated by the plan tests")
    RunConfig.from_yaml(path)


def test_non_finite_numbers_are_refused_with_their_field():
    """``lr: .inf`` was accepted and NaN weights followed."""
    with pytest.raises(ConfigError) as ei:
        RunConfig.from_yaml("optim:\n  lr: .inf\nsearch:\n  time_budget_s: .nan\n")
    assert [p.where for p in ei.value.problems] == ["optim.lr", "search.time_budget_s"]
    assert all("finite" in p.what for p in ei.value.problems)
