"""task.multiturn: unknown environment or tool names are named-field errors before start;
the names the config accepts are the registries' names."""

import typing

import pytest

from rpeg.config import EnvName, RunConfig, ToolName
from rpeg.errors import ConfigError
from rpeg.runtime.envs.base import environment_names
from rpeg.runtime.envs.tools import tool_names


def _problems(data) -> str:
    with pytest.raises(ConfigError) as exc:
        RunConfig.from_dict(data)
    return str(exc.value)


def test_unknown_environment_names_the_field():
    msg = _problems({"task": {"multiturn": {"env": "browser"}}})
    assert "task.multiturn.env" in msg and "'tools'" in msg


def test_unknown_tool_names_the_field():
    msg = _problems({"task": {"multiturn": {"env": "tools", "tools": ["calc", "shell"]}}})
    assert "task.multiturn.tools" in msg and "'calc'" in msg


def test_tool_task_needs_an_environment():
    msg = _problems({"task": {"kind": "tool_arithmetic", "rewards": ["tool_final_answer"]}})
    assert "multiturn.env" in msg


def test_single_turn_by_default():
    assert RunConfig().task.multiturn.env is None


def test_config_names_match_the_registries():
    assert sorted(typing.get_args(EnvName)) == environment_names()
    assert sorted(typing.get_args(ToolName)) == tool_names()


def test_shipped_config_loads():
    c = RunConfig.from_yaml("configs/tool-cpu.yaml")
    assert c.task.kind == "tool_arithmetic" and c.task.multiturn.env == "tools"


def test_tool_task_needs_the_final_answer_reward():
    msg = _problems({"task": {"kind": "tool_arithmetic", "multiturn": {"env": "tools"}}})
    assert "tool_final_answer" in msg and "rpeg.runtime.envs.answers" in msg
