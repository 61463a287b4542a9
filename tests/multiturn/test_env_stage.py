"""The env stage at run time (issue 31 item 1): the compiled step of a multi-turn config
runs generate and env in one unit; the env stage's work happened inside generate's turns,
so running it passes the batch on and its timeline span is the rollout's measured env_s;
a graph and a config that disagree about the environment are refused before anything
starts."""

import pytest

from rpeg.compile import compile_plan
from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.ir import StageKind, build
from rpeg.runtime import stages


def _tool():
    return RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {"cluster.num_devices": 2, "cluster.n_workers": 2}
    )


def test_env_span_is_the_measured_env_time_ending_with_generate():
    assert stages.env_span(10.0, {"env_s": 2.5, "turns_mean": 2.0}) == ("env", 7.5, 10.0)
    assert stages.env_span(4.0, {}) == ("env", 4.0, 4.0)  # a rollout that called no env


def test_running_the_env_stage_passes_the_batch_on():
    batch = object()
    out, m = stages.run_stage("env", stages.StageContext(_tool()), batch)
    assert out is batch and m == {}


def test_compiled_multiturn_step_runs_env_in_the_rollout_unit():
    step = compile_plan(None, _tool())
    first = step.tasks[0]
    assert first.name == "generate+env" and first.kinds == (StageKind.generate, StageKind.env)
    assert first.phase == "rollout" and first.fused and not first.streaming
    assert "generate+env" in [t.name for t in step.tasks_in("rollout")]


def test_graph_and_config_must_agree_about_the_environment():
    with pytest.raises(ConfigError, match="has no env stage: build it with the builder option"):
        compile_plan(build("grpo"), _tool())
    with pytest.raises(ConfigError, match="has an env stage but no environment is set"):
        compile_plan(build("grpo", multiturn=True), RunConfig())
