"""Typed actor proxies (rpeg.runtime.actors.proxies) over fake actor handles: no Dask.

A fake handle records when a call is issued and when its result is awaited, so the tests
check that every rank is called before any is awaited, and count the bytes by hand."""

import contextlib

import pytest
import torch

from rpeg.runtime.actors.failures import ActorLost
from rpeg.runtime.actors.proxies import RankGroup, broadcast_weights, join_sync_group


class _Client:
    def as_current(self):
        return contextlib.nullcontext()


class _Future:
    def __init__(self, log, name, value):
        self.log, self.name, self.value = log, name, value

    def result(self, timeout=None):
        self.log.append(("await", self.name))
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class _Handle:
    """Answers ``method(*args)`` with ``answers[method](rank, *args)``."""

    def __init__(self, log, rank, answers, group=""):
        self.log, self.rank, self.answers, self.group = log, rank, answers, group
        self.calls = []

    def __getattr__(self, method):
        if method not in self.answers:
            raise AttributeError(method)

        def call(*args):
            name = f"{self.group}{method}@{self.rank}"
            self.log.append(("issue", name))
            self.calls.append((method, args))
            return _Future(self.log, name, self.answers[method](self.rank, *args))

        return call


def _group(n, answers, name="g", counted=None, log=None):
    log = [] if log is None else log
    prefix = f"{name}." if name != "g" else ""
    handles = [_Handle(log, r, answers, prefix) for r in range(n)]
    count = None if counted is None else (lambda s, b: counted.append((s, b)))
    return RankGroup(_Client(), name, handles, count), log


def _issued_before_awaited(log):
    first_await = next(i for i, (what, _) in enumerate(log) if what == "await")
    return all(what == "issue" for what, _ in log[:first_await]) and not any(
        what == "issue" for what, _ in log[first_await:]
    )


def test_put_batch_counts_every_ranks_tensors_against_the_step():
    counted = []
    g, log = _group(3, {"put_batch": lambda r, step, b: b["x"].shape[0]}, counted=counted)
    batches = [{"x": torch.zeros(2, 4)}, {"x": torch.zeros(3, 4)}, {"x": torch.zeros(2, 4)}]
    assert g.put_batch(7, batches) == [2, 3, 2]
    # float32: (2 + 3 + 2) rows * 4 columns * 4 bytes
    assert counted == [(7, 7 * 4 * 4)]
    assert _issued_before_awaited(log)


def test_get_batch_of_some_ranks_counts_what_came_back():
    counted = []
    g, log = _group(
        4, {"get_batch": lambda r, step: torch.ones(r + 1, dtype=torch.int64)}, counted=counted
    )
    got = g.get_batch(3, ranks=[0, 2])
    assert [t.numel() for t in got] == [1, 3]
    assert counted == [(3, (1 + 3) * 8)]
    assert {n for _, n in log} == {"get_batch@0", "get_batch@2"}


def test_pull_and_commit_move_no_tensor_through_this_process():
    counted = []
    answers = {"pull": lambda r, step, slices, fields, stage: 10 * r, "commit": lambda r, step: 5}
    g, log = _group(2, answers, counted=counted)
    assert g.pull(1, [([], None, True), ([], None, True)]) == [0, 10]
    assert g.commit(1) == [5, 5]
    assert counted == []
    assert _issued_before_awaited(log[:4])


def test_without_a_counter_nothing_is_counted():
    g, _ = _group(1, {"put_batch": lambda r, step, b: 1})
    assert g.put_batch(0, [torch.zeros(3)]) == [1]


def test_rank_info_pairs_layout_and_memory_per_rank():
    answers = {"layout_info": lambda r: {"rank": r}, "memory_info": lambda r: {"rss": 100 + r}}
    g, _ = _group(2, answers)
    assert g.rank_info(timeout_s=1.0) == [({"rank": 0}, {"rss": 100}), ({"rank": 1}, {"rss": 101})]


def test_a_lost_worker_is_actor_lost_and_other_errors_stay_themselves():
    lost = RuntimeError("Worker holding Actor was lost.  Status: closed")
    g, _ = _group(2, {"drop": lambda r, step: lost if r == 1 else None})
    with pytest.raises(ActorLost, match="group g"):
        g.drop(0)
    g2, _ = _group(1, {"drop": lambda r, step: RuntimeError("boom")})
    with pytest.raises(RuntimeError, match="boom") as info:
        g2.drop(0)
    assert not isinstance(info.value, ActorLost)


def test_weight_sync_joins_and_broadcasts_issuing_every_rank_of_every_group_first():
    log = []
    src_answers = {
        "sync_rendezvous": lambda r: "host:1",
        "join_sync_group": lambda r, addr, rank, size: (addr, rank, size),
        "send_weights": lambda r, bb: {"version": 3.0, "bb": bb, "rank": r},
    }
    dst_answers = {
        "join_sync_group": lambda r, addr, rank, size: (addr, rank, size),
        "recv_weights": lambda r, bb: 3,
    }
    src, _ = _group(2, src_answers, name="trainer", log=log)
    a, _ = _group(1, dst_answers, name="gen0", log=log)
    b, _ = _group(2, dst_answers, name="gen1", log=log)
    join_sync_group(src, [a, b])
    joins = [n for what, n in log if what == "issue" and "join" in n]
    assert joins == [
        "trainer.join_sync_group@0",
        "gen0.join_sync_group@0",
        "gen1.join_sync_group@0",
        "gen1.join_sync_group@1",
    ]
    # sync ranks: the trainer's rank 0 is 0, then every generator rank; size 1 + 3
    ranks = [h.calls[-1][1] for h in (src.handles[0], a.handles[0], *b.handles)]
    assert ranks == [("host:1", 0, 4), ("host:1", 1, 4), ("host:1", 2, 4), ("host:1", 3, 4)]
    assert not any(m == "join_sync_group" for m, _ in src.handles[1].calls)
    del log[:]
    sent, versions = broadcast_weights(src, [a, b], 1024)
    assert [s["rank"] for s in sent] == [0, 1] and sent[0]["bb"] == 1024
    assert versions == [3, 3, 3]
    assert _issued_before_awaited(log)
