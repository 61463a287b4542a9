"""A worker lost while the actors start: the survivors are restarted and every actor is
started again on the live workers, up to ``runtime.step_retries`` times
(``failures.start_with_retries`` driving ``DistributedRun.restart_actors``; the process side
-- ``abandon``, ``recreate`` -- is the one recovery uses, tested with real workers in
test_runtime.py)."""

from __future__ import annotations

import pytest

from rpeg.runtime.actors.driver import DistributedRun
from rpeg.runtime.actors.failures import start_with_retries


class _Actors:
    def __init__(self, log, fail_recreates):
        self.log, self.fail = log, list(fail_recreates)

    def recreate(self, timeout_s):
        self.log.append("recreate")
        if self.fail:
            raise self.fail.pop(0)


class _Run:
    """What ``start_with_retries`` drives: start, abandon, and the real ``restart_actors``
    over a recorded ``recreate`` and sync group."""

    restart_actors = DistributedRun.restart_actors

    def __init__(self, first, fail_recreates=()):
        self.log: list[str] = []
        self.first = first
        self.actors = _Actors(self.log, fail_recreates)
        self._synced_once = True

    def start_actors(self):
        self.log.append("start")
        if self.first is not None:
            raise self.first

    def abandon(self):
        self.log.append("abandon")

    def _init_weight_sync(self):
        self.log.append("sync-group")


def _start(run, retries):
    warned: list[str] = []
    used = start_with_retries(run, retries, warn=warned.append)
    return used, warned


def test_a_clean_start_is_one_start():
    run = _Run(None)
    assert _start(run, 2) == (0, [])
    assert run.log == ["start"]


def test_a_worker_lost_while_starting_restarts_everything_once():
    run = _Run(ConnectionError("pair channel: rank 1 closed the connection"))
    used, warned = _start(run, 2)
    assert used == 1
    assert run.log == ["start", "abandon", "recreate", "sync-group"]
    assert len(warned) == 1 and "ConnectionError" in warned[0] and "1 of 2" in warned[0]
    assert run._synced_once is False  # the generators get the weights again


def test_retries_run_out_and_the_last_error_is_raised():
    lost = [TimeoutError("no answer"), TimeoutError("still none")]
    run = _Run(ConnectionError("gone"), fail_recreates=lost)
    with pytest.raises(TimeoutError, match="still none"):
        _start(run, 2)
    assert run.log.count("recreate") == 2 and run.log.count("abandon") == 2


def test_any_other_error_is_raised_at_once():
    run = _Run(ValueError("bad model file"))
    with pytest.raises(ValueError, match="bad model file"):
        _start(run, 5)
    assert run.log == ["start"]
