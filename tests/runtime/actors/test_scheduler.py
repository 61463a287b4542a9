"""The step scheduler driven by events only (no Dask, no Prefect): a simulated executor
completes in-flight instructions in a chosen order and ``validate()`` runs after every event.

The simulated work is deterministic in what a real run would make depend on the schedule
(the generator's weight version of each slot, the lags the trainer sees), so a resumed or
recovered run can be compared metric by metric with an uninterrupted one.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import yaml

from rpeg.compile import CompiledStep
from rpeg.runtime.step import messages as M
from rpeg.runtime.step import plan as P
from rpeg.runtime.step import scheduler as S

GOLDEN = Path(__file__).parent / "golden"


def compiled(case: str) -> CompiledStep:
    return CompiledStep.from_dict(yaml.safe_load((GOLDEN / f"{case}.yaml").read_text()))


SYNC = "reinforce_pp_fused_colocated"  # one group: units in order inside the step
SYNC_DP = "grpo_k0_colocated_dp2"
K0 = "ppo_k0_disaggregated"  # separate rollout group, k=0: through the buffer, on-policy
K1 = "grpo_k1_fused_disaggregated"
K2 = "ppo_shared_fused_k2"


class Sim:
    """Executes instructions: completes one in-flight instruction at a time (``order``:
    "fifo", "lifo" or a random seed), records everything, keeps checkpoints."""

    def __init__(self, sched: S.StepScheduler, order: str | int = "fifo"):
        self.s = sched
        self.order = order
        self.rng = random.Random(order if isinstance(order, int) else 0)
        self.flight: list = []
        self.emitted: list = []
        self.records: list[tuple[int, dict]] = []
        self.checkpoints: dict[int, dict] = {}
        self.max_flight: list[set] = []
        self.outcome = None
        self.lags: dict[int, tuple] = {}

    def feed(self, *events) -> None:
        todo = list(self.s.handle(*events))
        self.s.validate()
        while todo:
            ins = todo.pop(0)
            self.emitted.append(ins)
            if isinstance(ins, M.EndStep):
                todo += self.s.handle(M.StepEnded(ins.step, 1.0))
                self.s.validate()
            elif isinstance(ins, M.Record):
                self.records.append((ins.step, dict(ins.metrics)))
            elif isinstance(ins, M.Finish | M.Fail | M.Recover):
                self.outcome = ins
            elif isinstance(ins, M.BeginStep | M.Release):
                pass
            else:
                self.flight.append(ins)
        self.max_flight.append(
            {type(i).__name__ + str(getattr(i, "step", "")) for i in self.flight}
        )

    def result(self, ins):
        if isinstance(ins, M.RunUnit):
            return {
                "unit_s": 0.5,
                f"{ins.unit}_at": float(ins.step),
                "lag": self.lags.get(ins.step),
            }
        if isinstance(ins, M.Rollout):
            return {"reward_mean": 0.1 * ins.step, "gen_version": float(ins.version)}
        if isinstance(ins, M.Take):
            self.lags[ins.step] = ins.lags
            return {}
        if isinstance(ins, M.SyncWeights):
            return {"weight_sync_s": 0.2}
        if isinstance(ins, M.Checkpoint):
            self.checkpoints[ins.step_done] = copy.deepcopy(ins.state)
            return {"checkpoint_s": 0.3}
        if isinstance(ins, M.Evaluate):
            return 0.25 if ins.when == "before" else 0.75
        raise AssertionError(ins)

    def pick(self):
        if self.order == "fifo":
            return self.flight.pop(0)
        if self.order == "lifo":
            return self.flight.pop()
        return self.flight.pop(self.rng.randrange(len(self.flight)))

    def step_once(self, fail=None) -> None:
        ins = self.pick()
        ev = fail(ins) if fail is not None else None
        if ev is not None:
            self.feed(ev)
            return
        self.feed(ins.done(self.result(ins)))

    def run(self, start=None, *, fail=None, stop_after_checkpoint=None) -> None:
        self.feed(start or M.Start())
        while self.flight and self.outcome is None:
            self.step_once(fail)
            if stop_after_checkpoint is not None and stop_after_checkpoint in self.checkpoints:
                return


def make(case, steps, **kw) -> S.StepScheduler:
    return S.StepScheduler.from_compiled(compiled(case), steps, **kw)


def history(sched):
    """Metrics per step, without the checkpoint's own (a checkpoint cannot hold the time it
    took to write itself: the restored step-N record lacks them)."""
    return {
        s: {k: v for k, v in m.items() if not k.startswith("checkpoint_")}
        for s, m in sched.history.items()
    }


# --------------------------------------------------------------------------- sync (k=0)


@pytest.mark.parametrize("order", ["fifo", "lifo", 1, 2, 3])
def test_sync_runs_every_unit_once_per_step_in_dependency_order(order):
    c = compiled(SYNC)
    sim = Sim(make(SYNC, 3), order)
    sim.run()
    assert isinstance(sim.outcome, M.Finish)
    assert (sim.outcome.acc_before, sim.outcome.acc_after) == (0.25, 0.75)
    units = [i for i in sim.emitted if isinstance(i, M.RunUnit)]
    first = c.tasks[0].name
    assert [u.step for u in units if u.unit == first] == [0, 1, 2]
    names = [t.name for t in c.tasks]
    for step in range(3):
        got = [u.unit for u in units if u.step == step]
        assert sorted(got) == sorted(names)  # each unit exactly once
        for t in c.tasks:  # a unit is emitted only after its dependencies
            for d in t.depends_on + t.after:
                assert got.index(d) < got.index(t.name), (step, d, t.name)
    assert [s for s, _ in sim.records] == [0, 1, 2]
    assert all(m[f"{n}_at"] == s for s, m in sim.records for n in names)
    # no sync, take or rollout instruction in a synchronous layout
    assert not [i for i in sim.emitted if isinstance(i, M.Rollout | M.Take | M.SyncWeights)]


def test_units_without_a_dependency_path_are_in_flight_together():
    U = P.UnitWait
    plan = P.StepPlan(
        units=(U("a", ()), U("b", ()), U("c", ("a", "b"))),
        async_rollout=False,
        k=0,
        samples_per_step=4,
    )
    sim = Sim(S.StepScheduler(plan, 2), "lifo")
    sim.run()
    assert {"RunUnit0"} in sim.max_flight  # c alone, after a and b
    firsts = [
        {i.unit for i in sim.emitted if isinstance(i, M.RunUnit) and i.step == s} for s in (0, 1)
    ]
    assert firsts == [{"a", "b", "c"}] * 2
    pos = [i for i in sim.emitted if isinstance(i, M.RunUnit)]
    assert [i.unit for i in pos[:2]] in (["a", "b"], ["b", "a"])  # emitted together


def test_sync_step_metrics_and_checkpoint_metrics_land_in_the_step():
    sim = Sim(make(SYNC_DP, 4, checkpoint_every=2), "fifo")
    sim.run()
    assert sorted(sim.checkpoints) == [2, 4]
    recs = dict(sim.records)
    assert "checkpoint_s" in recs[1] and "checkpoint_s" in recs[3]
    assert "checkpoint_s" not in recs[0]
    assert all(m["step"] == s + 1 and m["step_s"] == 1.0 for s, m in recs.items())


# --------------------------------------------------------------------------- async


@pytest.mark.parametrize("case,k", [(K0, 0), (K1, 1), (K2, 2)])
@pytest.mark.parametrize("order", ["fifo", "lifo", 4, 5, 6, 7])
def test_async_lag_is_min_step_k_whatever_the_completion_order(case, k, order):
    steps = 6
    sim = Sim(make(case, steps), order)
    sim.run()
    assert isinstance(sim.outcome, M.Finish)
    rollouts = [i for i in sim.emitted if isinstance(i, M.Rollout)]
    # each slot generated once, in order, with the weights of step max(0, j-k)
    assert [r.step for r in rollouts] == list(range(steps))
    assert [r.version for r in rollouts] == [max(0, j - k) for j in range(steps)]
    recs = dict(sim.records)
    assert [recs[s]["staleness_max"] for s in range(steps)] == [min(s, k) for s in range(steps)]
    assert [recs[s]["gen_version"] for s in range(steps)] == [max(0, s - k) for s in range(steps)]
    # the trainer's weights reach the generators after every update (+ once at start)
    assert [i.version for i in sim.emitted if isinstance(i, M.SyncWeights)] == list(
        range(steps + 1)
    )


@pytest.mark.parametrize("case,k", [(K1, 1), (K2, 2)])
@pytest.mark.parametrize("order", ["fifo", "lifo", 3])
def test_async_generation_of_the_next_slot_does_not_wait_for_training(case, k, order):
    sim = Sim(make(case, 5), order)
    sim.run()
    em = sim.emitted

    def first(pred):
        return next(n for n, i in enumerate(em) if pred(i))

    for s in range(1, 5 - k):  # (step 0 fills the window one slot after the other)
        roll = first(lambda i, s=s: isinstance(i, M.Rollout) and i.step == s + k)
        unit = first(lambda i, s=s: isinstance(i, M.RunUnit) and i.step == s)
        # slot s+k is admitted once step s has its batch, before any of its training units
        assert roll < unit, (s, em)


def test_async_take_waits_for_its_slot_and_units_wait_for_the_take():
    sim = Sim(make(K1, 2), "fifo")
    sim.feed(M.Start())
    sim.step_once()  # the sync at start
    sim.step_once()  # evaluate before
    kinds = [type(i).__name__ for i in sim.flight]
    assert kinds == ["Rollout"]  # slot 0 first; no take and no unit before it is produced
    sim.step_once()
    assert [type(i).__name__ for i in sim.flight] == ["Take"]
    sim.step_once()  # the take: the next slot is generated while the step trains
    assert [type(i).__name__ for i in sim.flight] == ["Rollout", "RunUnit"]


# --------------------------------------------------------------------------- faults


def _lose_at(step, unit_pred=lambda i: isinstance(i, M.RunUnit)):
    fired = []

    def fail(ins):
        if not fired and getattr(ins, "step", None) == step and unit_pred(ins):
            fired.append(ins)
            return M.WorkerLost(ins, OSError("Unable to contact Actor's worker"))
        return None

    return fail, fired


def _recover_loop(sim, fail):
    sim.run(fail=fail)
    while isinstance(sim.outcome, M.Recover):
        sim.outcome = None
        sim.flight.clear()  # the executor waits for (and drops) abandoned work
        state = sim.checkpoints[max(sim.checkpoints)]
        sim.feed(M.Recovered(copy.deepcopy(state)))
        while sim.flight and sim.outcome is None:
            sim.step_once(fail)


@pytest.mark.parametrize("case", [SYNC_DP, K0, K1, K2])
@pytest.mark.parametrize("order", ["fifo", 8, 9])
def test_a_lost_worker_recovers_from_the_checkpoint_and_matches_an_uninterrupted_run(case, order):
    ref = Sim(make(case, 5, checkpoint_every=1, max_recoveries=1), order)
    ref.run()
    sim = Sim(make(case, 5, checkpoint_every=1, max_recoveries=1), order)
    fail, fired = _lose_at(3)
    _recover_loop(sim, fail)
    assert fired and sim.s.recoveries == 1
    assert isinstance(sim.outcome, M.Finish)
    assert history(sim.s) == history(ref.s)
    # step 3 was recorded once it finished (after the recovery), every step in order
    assert sorted({s for s, _ in sim.records}) == list(range(5))
    assert [s for s, _ in sim.records] == sorted(s for s, _ in sim.records)


def test_a_lost_rollout_is_regenerated_with_the_same_version():
    ref = Sim(make(K2, 6, checkpoint_every=2, max_recoveries=2), "fifo")
    ref.run()
    sim = Sim(make(K2, 6, checkpoint_every=2, max_recoveries=2), "fifo")
    fail, fired = _lose_at(4, lambda i: isinstance(i, M.Rollout))
    _recover_loop(sim, fail)
    assert fired and isinstance(sim.outcome, M.Finish)
    assert history(sim.s) == history(ref.s)


@pytest.mark.parametrize(
    "case,step,lost",
    [
        # k=1, B=8: lost in step 3's first unit; slot 4 was produced after the take (fifo),
        # the step-3 checkpoint holds steps 0-2 trained and slot 3 in its buffer: slot 4 again
        (K1, 3, lambda i: isinstance(i, M.RunUnit)),
        # k=1: the generator lost mid-rollout of slot 4 (a multi-turn sample between turns)
        (K1, 4, lambda i: isinstance(i, M.Rollout)),
        # k=0: step 3 generates inside the step; the checkpoint holds steps 0-2: step 3 again
        (SYNC_DP, 3, lambda i: isinstance(i, M.RunUnit) and i.unit == "train_actor"),
    ],
)
def test_a_recovery_counts_the_samples_it_generates_again(case, step, lost):
    sim = Sim(make(case, 5, checkpoint_every=1, max_recoveries=1), "fifo")
    fail, fired = _lose_at(step, lost)
    _recover_loop(sim, fail)
    assert fired and isinstance(sim.outcome, M.Finish)
    assert sim.s.regenerated_samples == 8  # one slot of B = 8 samples
    ref = Sim(make(case, 5, checkpoint_every=1, max_recoveries=1), "fifo")
    ref.run()
    assert ref.s.regenerated_samples == 0


def test_a_lost_checkpoint_write_regenerates_the_step_it_would_have_kept():
    # k=0: the step-4 checkpoint never commits; back to step 3's: step 3's 8 samples again
    sim = Sim(make(SYNC_DP, 5, checkpoint_every=1, max_recoveries=1), "fifo")
    fail, fired = _lose_at(None, lambda i: isinstance(i, M.Checkpoint) and i.step_done == 4)
    _recover_loop(sim, fail)
    assert fired and isinstance(sim.outcome, M.Finish)
    assert sim.s.regenerated_samples == 8


def test_results_of_abandoned_work_are_ignored_while_recovering():
    sim = Sim(make(K1, 4, checkpoint_every=1, max_recoveries=1), "fifo")
    sim.feed(M.Start())
    while not any(isinstance(i, M.RunUnit) and i.step == 1 for i in sim.flight):
        sim.step_once()
    late = [i for i in sim.flight]
    sim.feed(M.WorkerLost(late[0], OSError("gone")))
    assert isinstance(sim.outcome, M.Recover) and not sim.s.in_flight
    assert sim.s.handle(*(i.done(sim.result(i)) for i in late[1:])) == []
    sim.s.validate()


def test_without_a_checkpoint_store_or_retries_a_lost_worker_fails_the_run():
    for kw in ({}, {"checkpoint_every": 1, "max_recoveries": 0}):
        sim = Sim(make(SYNC_DP, 3, **kw), "fifo")
        fail, _ = _lose_at(1)
        sim.run(fail=fail)
        assert isinstance(sim.outcome, M.Fail) and sim.outcome.kind == "worker_lost"
        assert "step 1" in sim.outcome.reason
        # what the run raises says why it was not recovered and what to set; the worker's
        # own error is its cause; exit code 1 (a runtime failure, not bad input)
        exc = sim.outcome.exception()
        assert isinstance(exc, M.WorkerLostFailure) and exc.exit_code == 1
        assert exc.__cause__ is sim.outcome.error
        want = "runtime.checkpoint_url" if not kw else "runtime.step_retries"
        assert want in str(exc), str(exc)


def test_out_of_memory_is_reported_with_the_unit_and_not_retried():
    sim = Sim(make(SYNC_DP, 3, checkpoint_every=1, max_recoveries=5), "fifo")

    def fail(ins):
        if isinstance(ins, M.RunUnit) and ins.unit == "train_actor" and ins.step == 1:
            return M.OutOfMemory(ins, MemoryError("CUDA out of memory"))
        return None

    sim.run(fail=fail)
    assert isinstance(sim.outcome, M.Fail) and sim.outcome.kind == "oom"
    assert "'train_actor' of step 1" in sim.outcome.reason and sim.s.recoveries == 0


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("case", [SYNC_DP, K1, K2])
@pytest.mark.parametrize("stop", [1, 2, 3])
def test_a_run_stopped_after_step_n_and_resumed_equals_an_uninterrupted_one(case, stop):
    ref = Sim(make(case, 5, checkpoint_every=1), 11)
    ref.run()
    first = Sim(make(case, 5, checkpoint_every=1), 11)
    first.run(stop_after_checkpoint=stop)  # the process dies right after the checkpoint
    state = copy.deepcopy(first.checkpoints[stop])
    second = Sim(make(case, 5, checkpoint_every=1), 12)
    second.run(M.Start(state))
    assert isinstance(second.outcome, M.Finish)
    # no second "before" evaluation, and nothing before the checkpoint is redone
    assert not [i for i in second.emitted if isinstance(i, M.Evaluate) and i.when == "before"]
    assert min(i.step for i in second.emitted if isinstance(i, M.RunUnit)) == stop
    assert history(second.s) == history(ref.s)
    assert [s for s, _ in second.records] == list(range(stop, 5))


def test_the_checkpoint_state_holds_produced_samples_and_their_rollout_metrics():
    sim = Sim(make(K2, 6, checkpoint_every=1), "fifo")
    sim.run(stop_after_checkpoint=2)
    st = sim.checkpoints[2]
    ready = st["staleness"]["ready"]
    # after step 2 (k=2): slots 2 and 3 produced (versions 0 and 1), none admitted-only
    assert [(i // sim.s.B, v) for i, v, _ in ready][:: sim.s.B] == [(2, 0), (3, 1)]
    assert st["staleness"]["reissue"] == []
    assert sorted(st["rollout_metrics"]) == [2, 3]
    assert sorted(st["history"]) == [0, 1]


# --------------------------------------------------------------------------- protocol


def test_an_event_nobody_asked_for_is_refused():
    s = make(SYNC_DP, 2)
    s.handle(M.Start())
    with pytest.raises(M.SchedulerError, match="no such instruction"):
        s.handle(M.UnitFinished(0, "generate", {}))
    with pytest.raises(M.SchedulerError, match="Start while"):
        s.handle(M.Start())


def test_zero_steps_evaluates_and_finishes():
    sim = Sim(make(K1, 0), "fifo")
    sim.run()
    assert isinstance(sim.outcome, M.Finish) and not sim.records


def test_the_stimulus_log_replays_to_the_same_state():
    sim = Sim(make(K2, 4, checkpoint_every=2), 3)
    sim.run()
    replay = make(K2, 4, checkpoint_every=2)
    out = []
    for ev, ins in sim.s.log:
        got = replay.handle(ev)
        out.append([type(i).__name__ for i in got] == [type(i).__name__ for i in ins])
        replay.validate()
    assert all(out) and history(replay) == history(sim.s)
