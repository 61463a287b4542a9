"""A rank failure caused by a lost peer is a lost worker (issue 28): the classification of
collective errors, the choice of the error that says why among a call's ranks, and the
deterministic fault points that tests use to kill a rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rpeg.runtime.actors.failures import classify, first_cause, peer_lost
from rpeg.runtime.actors.fault_points import ENABLE, ENV, FaultPoint
from rpeg.runtime.actors.proxies import collect

# the survivor's error of issue 28 (kill -9 of rank 1 during the gradient all-reduce)
GLOO_RESET = RuntimeError(
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:40122: "
    "Connection reset by peer"
)
GLOO_TIMEOUT = RuntimeError(
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
    "120000ms for recv operation to complete"
)


def test_a_collective_broken_by_a_lost_peer_is_a_lost_worker():
    from torch.distributed import DistBackendError, DistNetworkError

    assert classify(GLOO_RESET) == "worker_lost"
    assert classify(GLOO_TIMEOUT) == "worker_lost"
    assert classify(DistNetworkError("anything")) == "worker_lost"
    assert classify(DistBackendError("NCCL communicator was aborted on rank 1")) == "worker_lost"
    # a bug stays a bug, also a RuntimeError with another message
    assert classify(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert classify(ValueError("Connection reset by peer")) is None  # not a RuntimeError
    assert not peer_lost(KeyError("x"))


def test_the_error_that_says_why_is_chosen_not_rank_0s():
    from distributed.comm.core import CommClosedError

    gone = CommClosedError("in <TCP (closed)>: Stream is closed")
    bug = ValueError("bad shape")
    assert first_cause([GLOO_RESET, gone]) is gone  # rank 1's process is gone
    assert first_cause([GLOO_RESET, bug]) is bug  # rank 1 raised; rank 0 only saw it leave
    assert first_cause([GLOO_TIMEOUT, GLOO_RESET]) is GLOO_TIMEOUT  # rank order within a kind


class _Fut:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def result(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


def test_collect_waits_for_the_other_ranks_errors_before_raising():
    from distributed.comm.core import CommClosedError

    assert collect([_Fut(1), _Fut(2)]) == [1, 2]
    gone = CommClosedError("worker gone")
    with pytest.raises(CommClosedError) as got:
        collect([_Fut(error=GLOO_RESET), _Fut(error=gone)])
    assert classify(got.value) == "worker_lost"
    assert got.value.__context__ is GLOO_RESET  # rank 0's own error is kept as context
    with pytest.raises(ValueError, match="bad"):
        collect([_Fut(error=GLOO_RESET), _Fut(error=ValueError("bad"))])
    # rank 0's bug; rank 1 still blocked in the all-reduce (our wait times out): the bug
    with pytest.raises(ValueError, match="bad"):
        collect([_Fut(error=ValueError("bad")), _Fut(error=TimeoutError())])


def test_fault_point_spec_is_parsed_and_checked():
    p = FaultPoint.parse("group=trainer rank=1 phase=train step=2 once=/tmp/x")
    assert p == FaultPoint("trainer", 1, "train", 2, "/tmp/x")
    assert FaultPoint.parse(p.format()) == p
    assert p.matches("trainer", 1, "train", 2)
    assert not p.matches("trainer", 0, "train", 2) and not p.matches("trainer", 1, "sync", 2)
    assert FaultPoint.parse("group=* rank=* phase=sync step=0 once=/x").matches("g", 3, "sync", 0)
    with pytest.raises(ValueError, match="phase 'fwd'; allowed: generate, train, sync"):
        FaultPoint.parse("group=a rank=0 phase=fwd step=1 once=/x")
    with pytest.raises(ValueError, match="missing \\['once'\\]"):
        FaultPoint.parse("group=a rank=0 phase=train step=1")


def test_fault_point_ends_the_process_once(tmp_path):
    once = tmp_path / "fired"
    code = (
        "from rpeg.runtime.actors.fault_points import fault_point\n"
        "fault_point('trainer', 0, 'train', 1)\n"  # not this step: nothing happens
        "fault_point('trainer', 1, 'train', 2)\n"
        "print('survived')\n"
    )
    env = {**os.environ, ENV: f"group=trainer rank=1 phase=train step=2 once={once}", ENABLE: "1"}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert first.returncode == 137 and "survived" not in first.stdout
    assert "trainer 1 train 2" in once.read_text()
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "survived" in again.stdout  # the replacement lives


class _LateFut:
    """A future whose result arrives while a bounded wait times out (the race of distributed's
    ActorFuture: result(timeout) raised TimeoutError, done() was already True)."""

    def __init__(self):
        self.calls = 0

    def result(self, timeout=None):
        self.calls += 1
        if self.calls == 1:
            raise TimeoutError("timed out after 0.5 s.")
        return "value"

    def done(self):
        return self.calls >= 1


def test_a_result_that_arrives_as_the_poll_times_out_is_returned_not_a_timeout():
    assert collect([_LateFut(), _Fut(2)]) == ["value", 2]


def test_arm_sets_and_clears_the_variable(monkeypatch):
    from rpeg.runtime.actors.fault_points import arm

    monkeypatch.delenv(ENV, raising=False)
    arm("group=g rank=0 phase=train step=1 once=/x")
    assert os.environ[ENV].startswith("group=g")
    arm(None)
    assert ENV not in os.environ
