"""The recovery state machine (rpeg.runtime.step.recovery) on its own: which survivors are
kept, which are ended, when the actors start again, when it gives up. Hand-built topologies
of the layouts in configs/ (no Dask, no torch)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rpeg.compile import WeightSync
from rpeg.runtime.step import recovery as R

# configs/async-cpu.yaml's shape: generators g0,g1 on workers A,B; trainers t0,t1 on C,D;
# the weight-sync group = trainer rank 0 + both generators
ASYNC = R.Topology(
    placement={("gen", 0): "A", ("gen", 1): "B", ("train", 0): "C", ("train", 1): "D"},
    collectives=(
        frozenset({("gen", 0), ("gen", 1)}),
        frozenset({("train", 0), ("train", 1)}),
        frozenset({("train", 0), ("gen", 0), ("gen", 1)}),
    ),
)
# two single-rank groups with a shared (no-collective) weight sync, and a dp=2 group
SPLIT = R.Topology(
    placement={("gen", 0): "A", ("train", 0): "B", ("ref", 0): "C", ("ref", 1): "D"},
    collectives=(frozenset({("ref", 0), ("ref", 1)}),),
)


def _seen(listed, answering=None, now=1.0):
    listed = tuple(listed)
    return R.WorkersSeen(listed, frozenset(listed if answering is None else answering), now)


def test_a_lost_trainer_rank_ends_every_rank_it_shares_a_collective_with_transitively():
    m = R.Recovery(ASYNC, expect=4, need=4)
    out = m.handle(R.Lost(answering=frozenset({"A", "B", "C"})))  # D (train rank 1) died
    # train 1 -> train 0 (dp group) -> gen 0, gen 1 (weight-sync group): nothing is intact
    assert m.lost == {"D"} and m.ended == {"A", "B", "C"}
    assert out == [R.PollWorkers()]
    # the replacement of D is not registered yet: keep polling, end nothing
    assert m.handle(_seen(["A", "B", "C", "D"], {"A", "B", "C"})) == [R.PollWorkers()]
    # D' registered: now the stuck survivors are ended (not before: docs/runtime.md)
    out = m.handle(_seen(["A", "B", "C", "D2"]))
    assert out == [R.EndProcesses(("A", "B", "C")), R.PollWorkers()]
    # while the old addresses are listed, wait; once four fresh ones answer: start there
    assert m.handle(_seen(["A", "B2", "C", "D2"])) == [R.PollWorkers()]
    assert m.handle(_seen(["A2", "B2", "C2", "D2"])) == [R.StartActors(("A2", "B2", "C2", "D2"))]


def test_survivors_outside_the_lost_ranks_collectives_are_kept():
    m = R.Recovery(SPLIT, expect=4, need=4)
    out = m.handle(R.Lost(answering=frozenset({"A", "C", "D"})))  # the trainer's worker B died
    assert m.ended == set()  # the generator and the reference group share nothing with it
    assert out == [R.CloseActors((("gen", 0), ("ref", 0), ("ref", 1))), R.PollWorkers()]
    assert m.handle(_seen(["A", "B2", "C", "D"])) == [R.StartActors(("A", "B2", "C", "D"))]


def test_a_broken_collective_with_every_process_alive_ends_that_group_only():
    """A timed-out all-reduce: everyone answers, the group's process group is broken."""
    m = R.Recovery(SPLIT, expect=4, need=4)
    out = m.handle(R.Lost(answering=frozenset("ABCD"), failed_groups=frozenset({"ref"})))
    assert out == [
        R.CloseActors((("gen", 0), ("train", 0))),
        R.EndProcesses(("C", "D")),
        R.PollWorkers(),
    ]
    assert m.handle(_seen(["A", "B", "C", "D"])) == [R.PollWorkers()]  # old C, D still listed
    assert m.handle(_seen(["A", "B", "C2", "D2"])) == [R.StartActors(("A", "B", "C2", "D2"))]


def test_nobody_missing_and_no_group_named_ends_every_rank_in_a_collective():
    m = R.Recovery(SPLIT, expect=4, need=4)
    out = m.handle(R.Lost(answering=frozenset("ABCD")))
    # a single-rank group holds no collective: its process is kept
    assert out[:2] == [R.CloseActors((("gen", 0), ("train", 0))), R.EndProcesses(("C", "D"))]


def test_at_the_deadline_it_starts_on_what_answers_if_the_plan_fits():
    m = R.Recovery(SPLIT, expect=5, need=4, deadline_s=10)  # a fifth, unused worker E
    m.handle(R.Lost(answering=frozenset("ACDE"), now=0.0))
    assert m.handle(_seen(["A", "B2", "C", "D"], now=5.0)) == [R.PollWorkers()]
    out = m.handle(_seen(["A", "B2", "C", "D"], now=11.0))
    assert out == [R.StartActors(("A", "B2", "C", "D"))]


def test_it_gives_up_naming_what_is_missing():
    m = R.Recovery(ASYNC, expect=4, need=4, deadline_s=10)
    m.handle(R.Lost(answering=frozenset("ABC"), now=0.0))
    m.handle(_seen(["A", "B", "C", "D2"], now=1.0))  # ends A, B, C; their deadline from 1.0
    out = m.handle(_seen(["D2"], now=12.0))  # none of them came back
    assert len(out) == 1 and isinstance(out[0], R.GiveUp)
    assert "1 of 1 listed workers answer, 4 expected" in out[0].reason
    assert "ended ['A', 'B', 'C']" in out[0].reason and m.phase == "failed"


def test_events_out_of_order_are_refused():
    m = R.Recovery(SPLIT, expect=4, need=4)
    with pytest.raises(RuntimeError, match="WorkersSeen while new"):
        m.handle(_seen(["A"]))
    m.handle(R.Lost(answering=frozenset("ACD")))
    with pytest.raises(RuntimeError, match="Lost while replacing"):
        m.handle(R.Lost(answering=frozenset("ACD")))


def test_topology_of_a_compiled_step_lists_its_collectives():
    g = {
        "gen": SimpleNamespace(name="gen", world_size=2),
        "train": SimpleNamespace(name="train", world_size=1),
    }
    compiled = SimpleNamespace(
        actor_groups=list(g.values()),
        weight_sync=WeightSync("bucketed", "train", ("gen",)),
        group=lambda n: g[n],
    )
    t = R.topology_of(compiled, {("gen", 0): "A", ("gen", 1): "B", ("train", 0): "C"})
    assert set(t.collectives) == {
        frozenset({("gen", 0), ("gen", 1)}),
        frozenset({("train", 0), ("gen", 0), ("gen", 1)}),
    }
    compiled.weight_sync = WeightSync("shared", "train")
    assert R.topology_of(compiled, t.placement).collectives == (
        frozenset({("gen", 0), ("gen", 1)}),
    )
