"""A worker that stops answering (SIGSTOP) is warned about, then handled as lost (issue 28:
a worker stopped for 60 s stalled the step with no warning)."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from rpeg.runtime.actors.stall_watch import Lost, StallMonitor, StallWatch, Warn


def test_the_watch_warns_once_then_declares_lost_once():
    w = StallWatch(warn_s=10, lost_s=30)
    assert w.seen(["a", "b"], {"a", "b"}, 0.0) == []
    assert w.seen(["a", "b"], {"a"}, 9.0) == []  # b silent 9 s
    assert w.seen(["a", "b"], {"a"}, 12.0) == [Warn("b", 12.0)]
    assert w.seen(["a", "b"], {"a"}, 20.0) == []  # warned once
    assert w.seen(["a", "b"], {"a"}, 31.0) == [Lost("b", 31.0)]
    assert w.seen(["a", "b"], {"a"}, 60.0) == []  # declared once
    assert w.seen(["a", "c"], {"a", "c"}, 61.0) == []  # a new worker starts its own clock


def test_lost_after_zero_only_warns():
    w = StallWatch(warn_s=1, lost_s=0)
    w.seen(["a"], {"a"}, 0.0)
    assert w.seen(["a"], set(), 5.0) == [Warn("a", 5.0)]
    assert w.seen(["a"], set(), 5000.0) == []


@pytest.mark.slow
def test_a_stopped_worker_is_warned_about_then_killed_and_replaced(caplog):
    from rpeg.infra import start_cluster

    cl = start_cluster(n_workers=2, torch_threads=1)
    try:
        victim = cl.workers[1]
        pid = cl.client.run(os.getpid, workers=[victim])[victim]
        mon = StallMonitor(cl, lambda: {victim: "g0 rank 1"}, warn_s=2, lost_s=8, every_s=1)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="rpeg.runtime.actors.stall_watch"):
            while not any(isinstance(e, Lost) for e in mon.events):
                assert time.monotonic() - t0 < 60, mon.events
                mon.tick(time.monotonic())
                time.sleep(1)
        kinds = [type(e).__name__ for e in mon.events]
        assert kinds == ["Warn", "Lost"]
        text = caplog.text
        assert f"worker {victim} (g0 rank 1) has not answered" in text
        assert "handled as lost" in text
        # the stopped process is gone and its nanny started a fresh one
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            addrs = cl.workers
            if len(addrs) == 2 and victim not in addrs and len(cl.answering(addrs)) == 2:
                break
            time.sleep(1)
        assert victim not in cl.workers and len(cl.answering(cl.workers)) == 2
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        cl.close()
