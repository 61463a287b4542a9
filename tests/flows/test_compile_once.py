"""A run compiles and checks its inputs once (issue 27), with no process-global memo (issue
37): ``train`` checks before Prefect starts and hands that compiled step to the ``rl_train``
flow body it starts, for that call only (a context variable); another config, or the same
config after the call, is checked again."""

from __future__ import annotations

import threading

import pytest
from rpeg.flows import run_setup

from rpeg.config import RunConfig


@pytest.fixture
def counted(monkeypatch):
    calls: list[RunConfig] = []

    def preflight(config, cluster_devices=None):
        calls.append(config)
        return _Step()  # a compiled step stand-in: returned as it is

    import rpeg.preflight
    import rpeg.runtime.engines.choice

    monkeypatch.setattr(rpeg.preflight, "preflight", preflight)
    monkeypatch.setattr(rpeg.runtime.engines.choice, "check_engine", lambda c, s: None)
    return calls


class _Step:  # a compiled step without CUDA groups
    actor_groups = ()


def _cfg(**over) -> RunConfig:
    return RunConfig.from_dict({"runtime": {"steps": 2, **over}})


def test_the_flow_body_takes_the_step_train_checked():
    cfg, step = _cfg(), object()
    assert run_setup.handed_step(cfg) is None  # nothing handed outside a call
    with run_setup.checked_step(cfg, step):
        # rl_train rebuilds the config from its JSON parameters: the same config, the step
        again = RunConfig.from_dict(cfg.model_dump(mode="json"))
        assert run_setup.handed_step(again) is step
        assert run_setup.handed_step(_cfg(steps=3)) is None  # another config: its own check
        seen: list = []  # another thread (another run in this process) has nothing handed
        t = threading.Thread(target=lambda: seen.append(run_setup.handed_step(again)))
        t.start()
        t.join()
        assert seen == [None]
    assert run_setup.handed_step(cfg) is None  # gone with the call


def test_setup_compiles_only_without_a_checked_step(counted):
    cfg, step = _cfg(), _Step()

    class Cluster:  # a running cluster's stand-in (the tests' shared one)
        workers = [0, 1]

    c, got, _, owned = run_setup.setup_run(cfg, None, False, Cluster(), checked=step)
    assert got is step and c is cfg and not owned and counted == []
    _, got, _, _ = run_setup.setup_run(cfg, None, False, Cluster())
    assert got is not step and len(counted) == 1
    # a resume changes the config: the handed step is not its own, it is checked again
    _, got, _, _ = run_setup.setup_run(cfg, None, True, Cluster(), checked=step)
    assert got is not step and len(counted) == 2
