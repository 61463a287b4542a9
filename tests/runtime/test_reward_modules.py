"""Reward code shipped to the workers: ``task.reward_modules`` (issue 28: a reward registered
in the driver passed the preflight, then the actors failed "unknown reward" 55 s later; there
was no documented way to ship reward code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError

MODULE = textwrap.dedent(
    """
    from rpeg.runtime.rewards import register_reward

    @register_reward("answer_length_issue28")
    def answer_length(prompt, response, reference):
        return float(len(response))
    """
)


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_issue28.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _cfg(tmp_path, modules):
    return RunConfig.from_dict(
        {
            "task": {"rewards": ["answer_length_issue28"], "reward_modules": modules},
            "runtime": {"output_dir": str(tmp_path / "out")},
        }
    )


def test_a_worker_process_loads_the_modules_before_its_rewards(module_dir):
    """A fresh process (what a Dask worker is: it never ran the driver's imports) builds the
    task's rewards from the config alone."""
    cfg = _cfg(module_dir, ["my_rewards_issue28"])
    code = textwrap.dedent(
        f"""
        import json
        from rpeg.config import RunConfig
        from rpeg.runtime.rewards import RewardSet
        cfg = RunConfig.from_yaml({cfg.to_yaml()!r})
        rs = RewardSet.from_task(cfg.task)
        print(json.dumps(rs(["p"], ["abcd"], ["r"]).per_reward))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(module_dir)}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.strip().splitlines()[-1]) == {"answer_length_issue28": [4.0]}


def test_the_preflight_imports_them_and_names_a_missing_one(module_dir):
    from rpeg.preflight import check_task

    assert check_task(_cfg(module_dir, ["my_rewards_issue28"])) == []
    problems = check_task(_cfg(module_dir, ["no_such_rewards_module"]))
    text = " ".join(str(p) for p in problems)
    assert "task.reward_modules[0]" in text and "no_such_rewards_module" in text


def test_building_rewards_with_an_unimportable_module_is_a_config_error(module_dir):
    from rpeg.runtime.rewards import RewardSet

    with pytest.raises(ConfigError, match="reward_modules"):
        RewardSet.from_task(_cfg(module_dir, ["no_such_rewards_module"]).task)
