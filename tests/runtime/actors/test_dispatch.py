"""rpeg.tasks.dispatch: units and takes run as direct driver calls when the flow gives a
pool (no Prefect task run), and a direct call's failure reaches the flow like a task's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from rpeg.flows.train import _outcome
from rpeg.tasks import dispatch

from rpeg.runtime.actors.failures import ActorLost
from rpeg.runtime.step import messages as M


class _Run:
    """Records what the dispatcher called; ``run_unit`` can be made to raise."""

    def __init__(self, fail: BaseException | None = None):
        self.calls: list[tuple] = []
        self.fail = fail

    def run_unit(self, step: int, unit: str) -> dict[str, float]:
        self.calls.append(("run_unit", step, unit))
        if self.fail is not None:
            raise self.fail
        return {"unit_s": 0.25}

    def take(self, step: int) -> dict[str, float]:
        self.calls.append(("take", step))
        return {}


@pytest.mark.parametrize("pool", [dispatch.Inline(), ThreadPoolExecutor(1)])
def test_units_and_takes_are_direct_driver_calls(pool, monkeypatch):
    def no_task(*a, **k):  # a Prefect task submitted here would fail the test
        raise AssertionError("a Prefect task was submitted for a direct instruction")

    monkeypatch.setattr(dispatch.run_unit_task, "submit", no_task, raising=False)
    monkeypatch.setattr(dispatch.take_task, "submit", no_task, raising=False)
    run = _Run()
    unit = M.RunUnit(3, "generate")
    ev = _outcome(unit, dispatch.submit(run, unit, pool))
    assert ev == M.UnitFinished(3, "generate", {"unit_s": 0.25})
    take = M.Take(4, (1,))
    assert _outcome(take, dispatch.submit(run, take, pool)) == M.BatchTaken(4, {})
    assert run.calls == [("run_unit", 3, "generate"), ("take", 4)]


def test_a_lost_actor_in_a_direct_call_is_a_worker_lost_event():
    unit = M.RunUnit(0, "train_actor")
    fut = dispatch.submit(_Run(fail=ActorLost("group g0: gone")), unit, dispatch.Inline())
    ev = _outcome(unit, fut)
    assert isinstance(ev, M.WorkerLost) and ev.instruction == unit


def test_any_other_error_in_a_direct_call_is_raised():
    unit = M.RunUnit(0, "reward")
    fut = dispatch.submit(_Run(fail=ValueError("bad reward")), unit, dispatch.Inline())
    with pytest.raises(ValueError, match="bad reward"):
        _outcome(unit, fut)


def test_other_instructions_stay_prefect_tasks(monkeypatch):
    seen = []
    monkeypatch.setattr(
        dispatch.rollout_task, "submit", lambda *a: seen.append(a) or "prefect-future"
    )
    run = _Run()
    assert dispatch.submit(run, M.Rollout(2, 1), dispatch.Inline()) == "prefect-future"
    assert seen == [(run, 2)] and run.calls == []
