"""The typed boundaries around the step scheduler: failure classes by exception type, the
per-rank metric reduction table, the one run summary."""

from __future__ import annotations

import errno

import pytest
import torch

from rpeg.runtime.actors.failures import ActorLost, classify
from rpeg.runtime.actors.unit_result import REDUCTIONS, Span, UnitResult, reduce_results
from rpeg.runtime.summary import SUMMARY_KEYS, run_summary


def test_worker_loss_is_recognised_by_type():
    from distributed import KilledWorker
    from distributed.comm.core import CommClosedError

    lost = [
        KilledWorker("task", "tcp://w:1", 3),
        CommClosedError("in <TCP (closed)>"),
        ConnectionResetError(104, "reset"),
        TimeoutError("rpc"),  # (= asyncio.TimeoutError)
        OSError("Unable to contact Actor's worker"),  # the actor handle's own
        ActorLost("Worker holding Actor was lost"),
    ]
    assert [classify(e) for e in lost] == ["worker_lost"] * len(lost)


def test_storage_errors_and_bugs_are_not_a_lost_worker():
    others = [
        OSError(errno.ENOSPC, "No space left on device"),
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.EROFS, "Read-only file system"),
        FileNotFoundError(errno.ENOENT, "gone"),
        RuntimeError("something was not found and the connection closed"),  # words only
        KeyError("step_s"),
        ValueError("lost"),
    ]
    assert [classify(e) for e in others] == [None] * len(others)


def test_out_of_memory_is_its_own_kind():
    assert classify(MemoryError()) == "oom"
    assert classify(torch.OutOfMemoryError("CUDA out of memory")) == "oom"


def test_rank_metrics_reduce_by_the_table():
    a = UnitResult({"unit_s": 1.0, "train_s": 0.5, "kl": 0.2}, (Span("train_actor", 0, 1),), 11, 10)
    b = UnitResult({"unit_s": 3.0, "train_s": 0.25, "kl": 0.4, "only_b": 7.0}, (), 12, 14)
    got = reduce_results([a, b])
    assert got["unit_s"] == 3.0 and got["train_s"] == 0.5  # the slowest rank
    assert got["num_tokens"] == 24.0  # summed
    assert got["kl"] == pytest.approx(0.3)  # mean
    assert got["only_b"] == 7.0  # mean over the ranks that report it
    assert "_spans" not in got and "_pid" not in got
    assert reduce_results([a]) == {"unit_s": 1.0, "train_s": 0.5, "kl": 0.2, "num_tokens": 10.0}
    assert REDUCTIONS["num_tokens"] is sum
    # a batch maximum is the largest rank's: ranks whose longest responses are 16 and 4
    long, short = (UnitResult({"response_length_max": v, "response_length": 3.0}) for v in (16, 4))
    assert reduce_results([long, short])["response_length_max"] == 16


def test_run_summary_by_hand():
    hist = [{"reward_mean": r, "step_s": t} for r, t in [(0.0, 3.0), (1.0, 1.0), (0.5, 2.0)]]
    s = run_summary(hist, wall_s=9.0, acc_before=0.1, acc_after=0.2, window=2)
    assert tuple(s) == SUMMARY_KEYS
    assert s["steps"] == 3 and s["median_step_s"] == 2.0
    # 3 steps are shorter than two windows of 2: steps 1 vs 3, not (1, 2) vs (2, 3)
    assert s["reward_first10"] == 0.0 and s["reward_last10"] == 0.5
    # keyed by step, and a step without a time (never recorded) does not break the median
    s2 = run_summary(
        {1: {"reward_mean": 1.0}, 0: {"reward_mean": 0.0, "step_s": 4.0}},
        wall_s=1.0,
        acc_before=None,
        acc_after=None,
    )
    assert s2["median_step_s"] == 4.0
    assert s2["reward_first10"] == 0.0 and s2["reward_last10"] == 1.0  # step 0 vs step 1
    assert run_summary([], wall_s=0.0, acc_before=None, acc_after=None)["median_step_s"] == 0.0
