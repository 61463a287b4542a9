"""CPU core binding of worker processes (rpeg.runtime.cpu_binding): hand-worked slots."""

from __future__ import annotations

import contextlib
import os

import pytest

from rpeg.runtime.cpu_binding import (
    HOST_CORES,
    bind_process,
    core_block,
    should_bind,
    worker_slots,
)


def test_core_blocks_split_a_host_or_share_it_round_robin():
    cores = [0, 1, 2, 3, 4, 5, 6, 7]
    assert [core_block(cores, i, 2) for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [core_block(cores, i, 3) for i in range(3)] == [[0, 1], [2, 3], [4, 5]]
    # more workers than cores: a tp pair (slots 0, 1) lands on two different cores
    assert [core_block([0, 1], i, 4) for i in range(4)] == [[0], [1], [0], [1]]
    assert core_block([3, 5], 0, 1) == [3, 5]  # the cores a cpuset allows, not 0..n-1
    with pytest.raises(ValueError, match="slot 2 of 2"):
        core_block(cores, 2, 2)
    with pytest.raises(ValueError, match="no cores"):
        core_block([], 0, 1)


def test_auto_binds_only_an_oversubscribed_host():
    assert should_bind("auto", 4, 2) and not should_bind("auto", 2, 2)
    assert should_bind("spread", 1, 8) and not should_bind("none", 16, 2)
    with pytest.raises(ValueError, match="allowed auto, spread, none"):
        should_bind("numa", 2, 2)


def test_worker_slots_count_per_host_in_worker_order():
    assert worker_slots(["a", "b", "a", "a", "b"]) == [(0, 3), (0, 2), (1, 3), (2, 3), (1, 2)]
    assert worker_slots([]) == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_bind_process_binds_every_thread_and_new_threads_inherit_it():
    import threading

    before = {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}
    stop = threading.Event()
    early = threading.Thread(target=stop.wait, daemon=True)
    early.start()  # a thread that exists before the binding
    try:
        core = HOST_CORES[-1]
        assert bind_process([core]) == [core]
        for t in os.listdir("/proc/self/task"):
            assert os.sched_getaffinity(int(t)) == {core}
        seen = []
        late = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        late.start()
        late.join()
        assert seen == [{core}]
    finally:
        stop.set()
        early.join()
        for t, cpus in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(t, cpus)
