"""A rank that failed is reported while an earlier rank still waits for it in a collective.
Before, ``collect`` waited for rank 0 first: with rank 0 blocked in an all-reduce whose peer
ran out of memory, the OOM surfaced only at the collective's timeout (now 30 min or more,
``runtime.collective_timeout_s``)."""

from __future__ import annotations

import threading
import time

import pytest

from rpeg.runtime.actors import proxies
from rpeg.runtime.actors.proxies import collect


class Fut:
    """An actor future: ``result(timeout)`` waits, raises TimeoutError when it passes."""

    def __init__(self, value=None, error=None, after_s: float | None = 0.0):
        self.value, self.error = value, error
        self.ready = threading.Event()
        if after_s is not None:
            threading.Timer(after_s, self.ready.set).start()

    def done(self) -> bool:
        return self.ready.is_set()

    def result(self, timeout=None):
        if not self.ready.wait(timeout):
            raise TimeoutError("wait passed")
        if self.error is not None:
            raise self.error
        return self.value


def test_a_later_ranks_error_is_raised_while_rank_0_is_blocked(monkeypatch):
    monkeypatch.setattr(proxies, "WATCH_S", 0.05)
    monkeypatch.setattr(proxies, "PEER_ERRORS_WAIT_S", 0.2)
    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    blocked = Fut(after_s=None)  # in the collective, until its timeout
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        collect([blocked, Fut(error=oom)])
    assert time.monotonic() - t0 < 5.0


def test_results_in_order_and_a_ranks_own_timeout_error_is_its_own(monkeypatch):
    monkeypatch.setattr(proxies, "WATCH_S", 0.05)
    assert collect([Fut(1, after_s=0.2), Fut(2), Fut(3, after_s=0.1)]) == [1, 2, 3]
    with pytest.raises(TimeoutError, match="chunk 3"):  # raised by the rank, not the wait
        collect([Fut(error=TimeoutError("chunk 3 not produced"), after_s=0.1)])


def test_the_callers_timeout_still_applies(monkeypatch):
    monkeypatch.setattr(proxies, "WATCH_S", 0.05)
    monkeypatch.setattr(proxies, "PEER_ERRORS_WAIT_S", 0.1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        collect([Fut(after_s=None), Fut(1)], timeout_s=0.3)
    assert 0.25 < time.monotonic() - t0 < 5.0


class SlowHandOver(Fut):
    """A finished call whose outcome the client's event loop hands over late (a loaded
    machine): ``done()`` is True, but ``result`` needs 1.5 s before it returns."""

    def result(self, timeout=None):
        if timeout is not None and timeout < 1.5:
            raise TimeoutError("the loop did not run in time")
        return super().result(timeout)


def test_a_finished_call_handed_over_late_is_its_result_not_a_timeout(monkeypatch):
    """Dask's ActorFuture.result goes through the client's event loop even when done: a
    finished rank must not read as timed out (it did with a 1 s allowance under load)."""
    monkeypatch.setattr(proxies, "WATCH_S", 0.05)
    slow = SlowHandOver(value="done", after_s=0.1)
    assert collect([slow, Fut(value="other")]) == ["done", "other"]
