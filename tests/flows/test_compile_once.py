"""A run compiles and checks its inputs once (issue 27): run_train checks before Prefect
starts and the flow body takes that compiled step; nothing remembered is reused for another
config, after the run, or past its time."""

from __future__ import annotations

import pytest
from rpeg.flows import run_setup

from rpeg.config import RunConfig


@pytest.fixture
def counted(monkeypatch):
    calls: list[RunConfig] = []

    def preflight(config, cluster_devices=None):
        calls.append(config)
        return object()  # a compiled step stand-in: returned as it is

    import rpeg.preflight
    import rpeg.runtime.engines.choice

    monkeypatch.setattr(rpeg.preflight, "preflight", preflight)
    monkeypatch.setattr(rpeg.runtime.engines.choice, "check_engine", lambda c, s: None)
    run_setup.forget_checked()
    yield calls
    run_setup.forget_checked()


def _cfg(**over) -> RunConfig:
    return RunConfig.from_dict({"runtime": {"steps": 2, **over}})


def test_the_flow_body_takes_the_step_run_train_checked(counted):
    cfg = _cfg()
    first = run_setup.validate_before_start(cfg, remember=True)
    # rl_train rebuilds the config from its JSON parameters: the same config, the same step
    again = RunConfig.from_dict(cfg.model_dump(mode="json"))
    assert run_setup.validate_before_start(again) is first
    assert len(counted) == 1
    # taken once: a second flow body (or run) checks again
    run_setup.validate_before_start(again)
    assert len(counted) == 2


def test_another_config_or_device_count_is_checked_again(counted):
    run_setup.validate_before_start(_cfg(), remember=True)
    run_setup.validate_before_start(_cfg(steps=3))
    run_setup.validate_before_start(_cfg(), cluster_devices=4)
    assert len(counted) == 3
    run_setup.validate_before_start(_cfg())  # still remembered: the others did not take it
    assert len(counted) == 3


def test_a_remembered_step_expires_and_is_forgotten(counted, monkeypatch):
    run_setup.validate_before_start(_cfg(), remember=True)
    run_setup.forget_checked()  # run_train's finally: the run ended before its flow body
    run_setup.validate_before_start(_cfg())
    assert len(counted) == 2
    run_setup.validate_before_start(_cfg(), remember=True)
    now = run_setup.time.monotonic()
    monkeypatch.setattr(run_setup.time, "monotonic", lambda: now + run_setup.REMEMBERED_FOR_S + 1)
    run_setup.validate_before_start(_cfg())
    assert len(counted) == 4
