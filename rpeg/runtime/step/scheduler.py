"""The RL step as a state machine: events in, instructions out, no I/O.

Modelled on the design of dask's ``distributed/worker_state_machine.py`` (a sans-IO core that
turns stimuli into instructions, keeps a stimulus log and checks its invariants in
``validate_state()``); no code of it is used. :class:`StepScheduler` decides *everything*
about a run's order of work: which units of which step may run, when a rollout is admitted
(through the staleness state of :mod:`rpeg.runtime.step.staleness`), when the trainer takes
its batch, when weights are synced, when to checkpoint, when to recover and when the run is
over. The flow (``rpeg.flows.train``) executes the instructions on Prefect tasks and feeds
each result back as an event; it decides nothing.

Events (inputs) and instructions (outputs) are plain data in
:mod:`rpeg.runtime.step.messages`:

Events (inputs)                          Instructions (outputs)
  Start(state)                             SyncWeights(version)   trainer -> generators
  WeightsSynced(version, metrics)          Evaluate(when)         held-out accuracy
  Evaluated(when, accuracy)                BeginStep(step)        (stamp the step's start)
  RolloutProduced(step, version, metrics)  Rollout(step, version) generate slot ``step``
  BatchTaken(step, metrics)                Take(step, lags)       buffer -> trainer group
  UnitFinished(step, unit, metrics)        RunUnit(step, unit)    one execution unit
  StepEnded(step, seconds)                 Release(step)          drop the step's batches
  CheckpointWritten(step_done, metrics)    EndStep(step)          (report the step's wall time)
  WorkerLost(instruction, error)           Checkpoint(step_done, state)
  OutOfMemory(instruction, error)          Record(step, metrics)  a finished step's metrics
  Recovered(state)                         Recover(reason)        re-create actors, restore
                                           Finish(acc_before, acc_after) / Fail(kind, ...)

Async schedule (a separate rollout group, staleness bound k). Slot j (the batch of step j) is
generated with the weights the generators hold when step ``max(0, j-k)`` begins, so its lag
at training time is ``min(j, k)`` whatever the timing of the processes: a step's weight sync
waits until every slot of its window ``[.., min(step+k, steps-1)]`` is produced, rollouts run
one at a time on the rollout group (a slot ahead of the step once the trainer took the step's
batch, so that it is generated while the step trains), and a checkpoint is written after the sync, when no rollout
is in flight (the buffer then holds only produced samples, restored as they were). That is
what makes a resumed or recovered run equal an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

from rpeg.compile.step import CompiledStep
from rpeg.runtime.step import staleness as st
from rpeg.runtime.step.invariants import SchedulerInvariants
from rpeg.runtime.step.messages import (
    STEP_VALIDATION,
    BatchTaken,
    BeginStep,
    Checkpoint,
    CheckpointWritten,
    EndStep,
    Evaluate,
    Evaluated,
    Fail,
    Finish,
    OutOfMemory,
    Record,
    Recover,
    Recovered,
    Release,
    Rollout,
    RolloutProduced,
    RunUnit,
    SchedulerError,
    Start,
    StepEnded,
    SyncWeights,
    Take,
    UnitFinished,
    WeightsSynced,
    WorkerLost,
)
from rpeg.runtime.step.plan import StepPlan
from rpeg.runtime.step.regeneration import begun_samples, regenerated

STATE_FORMAT = 1


# --------------------------------------------------------------------------- the machine


class StepScheduler(SchedulerInvariants):
    """The state of a run's steps; ``handle(*events) -> [instructions]``.

    ``checkpoint_every``: None without a checkpoint store (then a lost worker fails the run);
    ``max_recoveries``: how many lost workers the run survives (``runtime.step_retries``).
    """

    def __init__(
        self,
        plan: StepPlan,
        steps: int,
        *,
        checkpoint_every: int | None = None,
        max_recoveries: int = 0,
        val_every: int | None = None,
        val_before_train: bool = True,
    ):
        if steps < 0:
            raise SchedulerError(f"steps must be >= 0 (got {steps})")
        self.plan = plan
        self.steps = steps
        self.checkpoint_every = checkpoint_every
        self.max_recoveries = max_recoveries
        # validation (runtime.val_every, runtime.val_before_train; rpeg.runtime.validation)
        self.val_every = val_every
        self.val_before_train = val_before_train
        self.unit_names = tuple(u.name for u in plan.units)
        self.B = plan.samples_per_step
        # --- run state (checkpointed: see state_dict)
        self.step = 0  # the step being trained (== trainer policy version at its start)
        self.acc_before: float | None = None
        self.acc_after: float | None = None
        self.history: dict[int, dict[str, float]] = {}  # finished steps' metrics
        self.rollout_metrics: dict[int, dict[str, float]] = {}  # produced slots, not trained
        self.staleness = st.StalenessState(k=plan.k, batch_size=self.B)
        # --- per-process state
        self.phase = "new"  # new starting step checkpoint recovering finishing done failed
        self.recoveries = 0
        self.regenerated_samples, self._begun = 0, frozenset[int]()  # see .regeneration
        self.in_flight: dict[tuple[Any, ...], Any] = {}
        self.done: set[str] = set()  # units (and "take") of the current step that finished
        self.parts: dict[str, dict[str, float]] = {}
        self.lags: tuple[int, ...] = ()
        self.trained = False  # every unit of the current step finished
        self.synced = False  # the current step's weight sync finished (or is not needed)
        self.log: list[tuple[Any, list[Any]]] = []  # the stimulus log: (event, instructions)
        # unit -> predicted peak GiB per device, named when it runs out of memory
        # (rpeg.runtime.actors.predicted.unit_memory_gib; set by the flow)
        self.predicted_memory_gib: dict[str, float] = {}

    @classmethod
    def from_compiled(cls, compiled: CompiledStep, steps: int, **kw: Any) -> StepScheduler:
        return cls(StepPlan.from_compiled(compiled), steps, **kw)

    # ---------------------------------------------------------------- entry
    def handle(self, *events: Any) -> list[Any]:
        out: list[Any] = []
        for ev in events:
            ins = self._handle(ev)
            self.log.append((ev, list(ins)))
            out.extend(ins)
        return out

    def _handle(self, ev: Any) -> list[Any]:
        if self.phase in ("done", "failed"):
            return []  # late results after the end (e.g. an abandoned task) change nothing
        if isinstance(ev, WorkerLost):
            return self._lost(ev)
        if isinstance(ev, OutOfMemory):
            return self._oom(ev)
        if isinstance(ev, Start):
            return self._start(ev.state, fresh=True)
        if isinstance(ev, Recovered):
            if self.phase != "recovering":
                raise SchedulerError(f"Recovered while {self.phase}")
            return self._start(ev.state, fresh=False)
        if self.phase == "recovering":
            return []  # the result of abandoned work: the checkpoint decides what stands
        if isinstance(ev, StepEnded):
            return self._step_ended(ev)
        key = _event_key(ev)
        if key not in self.in_flight:
            raise SchedulerError(f"{ev!r}: no such instruction in flight")
        del self.in_flight[key]
        if isinstance(ev, WeightsSynced):
            return self._weights_synced(ev)
        if isinstance(ev, Evaluated):
            return self._evaluated(ev)
        if isinstance(ev, RolloutProduced):
            return self._produced(ev)
        if isinstance(ev, BatchTaken):
            self.done.add("take")
            self.parts["take"] = {"staleness_max": float(max(self.lags, default=0)), **ev.metrics}
            return self._rollouts() + self._ready_units()
        if isinstance(ev, UnitFinished):
            self.done.add(ev.unit)
            self.parts[ev.unit] = dict(ev.metrics)
            if all(u in self.done for u in self.unit_names):
                return self._trained()
            return self._ready_units()
        if isinstance(ev, CheckpointWritten):
            return self._checkpointed(ev)
        raise SchedulerError(f"unknown event {ev!r}")

    def _emit(self, ins: Any) -> Any:
        self.in_flight[ins.key] = ins
        return ins

    # ---------------------------------------------------------------- start / end
    def _start(self, state: dict[str, Any] | None, *, fresh: bool) -> list[Any]:
        if fresh and self.phase != "new":
            raise SchedulerError(f"Start while {self.phase}")
        if state is not None:
            if not fresh:  # a recovery: what it generates again (rpeg.runtime.step.regeneration)
                self.regenerated_samples += regenerated(self._begun, state, self.B)
            self.load_state_dict(state)
        self.in_flight.clear()
        self.phase = "starting"
        if self.plan.async_rollout:  # the generators get the trainer's weights first
            return [self._emit(SyncWeights(self.staleness.trainer_version))]
        return self._started()

    def _started(self) -> list[Any]:
        if self.acc_before is None and self.val_before_train and not self.history:
            return [self._emit(Evaluate("before"))]
        return self._begin_step()

    def _weights_synced(self, ev: WeightsSynced) -> list[Any]:
        self._apply(st.GeneratorSynced(ev.version))
        if self.phase == "starting":
            return self._started()
        self.parts["sync"] = dict(ev.metrics)
        self.synced = True
        return self._end_step()

    def _evaluated(self, ev: Evaluated) -> list[Any]:
        if ev.when == "before":
            self.acc_before = ev.accuracy
            return self._begin_step()
        if ev.when.startswith(STEP_VALIDATION):  # in the step's line (runtime.val_every)
            self.history[self.step - 1].update(ev.metrics)
            if self.step >= self.steps:
                self.acc_after = ev.accuracy
            return self._after_step(self.history[self.step - 1])
        self.acc_after = ev.accuracy
        self.phase = "done"
        return [Finish(self.acc_before, self.acc_after)]

    # ---------------------------------------------------------------- a step
    def _begin_step(self) -> list[Any]:
        if self.step >= self.steps:
            if self.acc_after is not None:  # validated after the last step
                self.phase = "done"
                return [Finish(self.acc_before, self.acc_after)]
            self.phase = "finishing"
            return [self._emit(Evaluate("after"))]
        self.phase = "step"
        self.done, self.parts, self.lags = set(), {}, ()
        self.trained = self.synced = False
        out: list[Any] = [BeginStep(self.step)]
        if self.plan.async_rollout:
            out += self._rollouts() + self._take()
        return out + self._ready_units()

    def _window_end(self) -> int:
        """Last slot that may be generated while the current step trains."""
        return min(self.step + self.plan.k, self.steps - 1)

    def _next_slot(self) -> int:
        s = self.staleness
        if s.reissue:
            return s.step_of(min(s.reissue))
        return s.step_of(s.next_index)

    def _rolling(self) -> bool:
        return any(key[0] == "rollout" for key in self.in_flight)

    def _rollouts(self) -> list[Any]:
        """At most one rollout in flight, slots of the current window in order; a slot ahead
        of the current step once the trainer took its batch (so that its generation runs
        while the step trains)."""
        if self.phase != "step" or self._rolling() or self.synced:
            return []
        slot = self._next_slot()
        if slot > self._window_end() or (slot > self.step and "take" not in self.done):
            return []
        (ins,) = self._apply(st.RequestSlot(self.staleness.generator_version, self.B))
        if isinstance(ins, st.Block):
            return []  # the step's weight sync (below) unblocks it
        if ins.count != self.B or ins.start != slot * self.B:
            raise SchedulerError(f"admitted {ins} for slot {slot}: slots are admitted whole")
        return [self._emit(Rollout(slot, ins.version))]

    def _produced(self, ev: RolloutProduced) -> list[Any]:
        lo = ev.step * self.B
        samples = tuple(st.Sample(i, ev.version, payload=ev.step) for i in range(lo, lo + self.B))
        self._apply(st.Produced(samples))
        self.rollout_metrics[ev.step] = dict(ev.metrics)
        return self._take() + self._rollouts() + self._maybe_sync()

    def _take(self) -> list[Any]:
        if self.phase != "step" or "take" in self.done or ("take", self.step) in self.in_flight:
            return []
        (ins,) = self._apply(st.Take(self.step))
        if isinstance(ins, st.Wait):
            return []
        if isinstance(ins, st.Stalled):
            return self._fail(Fail("protocol", ins.reason))
        self.lags = ins.lags
        return [self._emit(Take(self.step, ins.lags))]

    def _ready_units(self) -> list[Any]:
        if self.plan.async_rollout and "take" not in self.done:
            return []
        out = []
        for u in self.plan.units:
            if u.name in self.done or ("unit", self.step, u.name) in self.in_flight:
                continue
            if all(d in self.done for d in u.deps):
                out.append(self._emit(RunUnit(self.step, u.name)))
        return out

    def _trained(self) -> list[Any]:
        self.trained = True
        if not self.plan.async_rollout:
            return self._end_step()
        self._apply(st.Publish(self.step + 1))
        return self._maybe_sync()

    def _maybe_sync(self) -> list[Any]:
        """The step's weight sync, once it trained and its whole rollout window is produced."""
        if self.phase != "step" or not self.trained or self.synced:
            return []
        if self._rolling() or self._next_slot() <= self._window_end():
            return []
        if ("sync", self.step + 1) in self.in_flight:
            return []
        v = self.step + 1
        more = v + self.plan.k <= self.steps - 1  # a later slot needs weights >= v
        if v % self.plan.sync_every == 0 or (more and self.staleness.generator_version < v):
            return [self._emit(SyncWeights(v))]
        self.synced = True
        return self._end_step()

    def _end_step(self) -> list[Any]:
        self.in_flight[("end", self.step)] = EndStep(self.step)
        return [Release(self.step), EndStep(self.step)]

    def _step_ended(self, ev: StepEnded) -> list[Any]:
        if self.in_flight.pop(("end", ev.step), None) is None or ev.step != self.step:
            raise SchedulerError(f"{ev!r}: step {self.step} was not ending")
        m: dict[str, float] = {"step": self.step + 1}  # 1-based, as the console counts
        if self.plan.async_rollout:
            m.update(self.parts.get("take", {}))
        for u in self.unit_names:
            m.update(self.parts.get(u, {}))
        if self.plan.async_rollout:
            m.update(self.parts.get("sync", {}))
            m.update(self.rollout_metrics.pop(self.step, {}))
        m.update(ev.metrics)
        m["step_s"] = float(ev.seconds)
        m["tokens_per_s"] = m.get("num_tokens", 0.0) / max(m["step_s"], 1e-9)
        self.history[self.step] = m
        self.step += 1
        self.done, self.parts, self.lags = set(), {}, ()
        self.trained = self.synced = False
        if self.step >= self.steps or (self.val_every and self.step % self.val_every == 0):
            self.phase = "validating"  # the metrics join the step's line, then on
            return [self._emit(Evaluate(f"{STEP_VALIDATION}{self.step}"))]
        return self._after_step(m)

    def _after_step(self, m: dict[str, float]) -> list[Any]:
        """A finished (and validated) step: its checkpoint, or its record and the next."""
        every = self.checkpoint_every
        if every and (self.step % every == 0 or self.step == self.steps):
            self.phase = "checkpoint"
            return [self._emit(Checkpoint(self.step, self.state_dict()))]
        return [Record(self.step - 1, m), *self._begin_step()]

    def _checkpointed(self, ev: CheckpointWritten) -> list[Any]:
        m = self.history[ev.step_done - 1]
        m.update(ev.metrics)
        return [Record(ev.step_done - 1, m, checkpoint=ev.step_done), *self._begin_step()]

    # ---------------------------------------------------------------- failures
    def _lost(self, ev: WorkerLost) -> list[Any]:
        if self.phase == "recovering":
            return []
        what = _describe(ev.instruction)
        if self.checkpoint_every and self.recoveries < self.max_recoveries:
            self.recoveries += 1
            self._begun = begun_samples(self)
            self.phase = "recovering"
            self.in_flight.clear()
            return [Recover(f"{what}: worker lost ({_err(ev.error)})")]
        why = (
            "not recovered: no checkpoint store (set runtime.checkpoint_url, e.g. "
            "file:///tmp/rpeg-ckpt, and the run recovers from its last checkpoint)"
            if not self.checkpoint_every
            else f"not recovered: all {self.max_recoveries} retries used (runtime.step_retries)"
        )
        return self._fail(
            Fail("worker_lost", f"{what}: worker lost ({_err(ev.error)}); {why}", ev.error)
        )

    def _oom(self, ev: OutOfMemory) -> list[Any]:
        ins = ev.instruction
        if isinstance(ins, RunUnit):
            units = [ins.unit]
        else:  # a rollout: its generation units
            units = [u for u in self.predicted_memory_gib if u.startswith("generate")]
        pred = [(u, self.predicted_memory_gib[u]) for u in units if u in self.predicted_memory_gib]
        told = (
            "; the plan predicted "
            + ", ".join(f"{gib:.2f} GiB per device for {u}" for u, gib in pred)
            + " (rpeg predict)"
            if pred
            else ""
        )
        return self._fail(
            Fail(
                "oom",
                f"{_describe(ins)} ran out of memory ({_err(ev.error)}){told}; not "
                "retried: a smaller micro_batch_size, shorter responses or more devices help",
                ev.error,
            )
        )

    def _fail(self, ins: Fail) -> list[Any]:
        self.phase = "failed"
        self.in_flight.clear()  # the executor abandons what is still running
        return [ins]

    # ---------------------------------------------------------------- staleness
    def _apply(self, event: Any) -> list[Any]:
        out = self.staleness.handle(event)
        for ins in out:
            if isinstance(ins, st.Reject):
                raise SchedulerError(f"staleness protocol: {ins.reason}")
        return out

    # ---------------------------------------------------------------- checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint after ``self.step`` steps needs to continue exactly."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "acc_before": self.acc_before,
            "history": {s: dict(m) for s, m in self.history.items() if s < self.step},
            "rollout_metrics": {s: dict(m) for s, m in self.rollout_metrics.items()},
            "staleness": self.staleness.state_dict(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.step = int(d["step"])
        self.acc_before = d.get("acc_before")
        self.history = {int(s): dict(m) for s, m in d.get("history", {}).items()}
        self.rollout_metrics = {int(s): dict(m) for s, m in d.get("rollout_metrics", {}).items()}
        self.staleness = st.StalenessState.from_state_dict(d["staleness"], k=self.plan.k)


def _event_key(ev: Any) -> tuple[Any, ...]:
    if isinstance(ev, WeightsSynced):
        return ("sync", ev.version)
    if isinstance(ev, Evaluated):
        return ("evaluate", ev.when)
    if isinstance(ev, RolloutProduced):
        return ("rollout", ev.step)
    if isinstance(ev, BatchTaken):
        return ("take", ev.step)
    if isinstance(ev, UnitFinished):
        return ("unit", ev.step, ev.unit)
    if isinstance(ev, CheckpointWritten):
        return ("checkpoint", ev.step_done)
    raise SchedulerError(f"unknown event {ev!r}")


def _describe(ins: Any) -> str:
    if isinstance(ins, RunUnit):
        return f"unit {ins.unit!r} of step {ins.step}"
    if isinstance(ins, Rollout):
        return f"rollout of step {ins.step}"
    if ins is None:
        return "the run"
    return type(ins).__name__ + "".join(f" {v}" for v in getattr(ins, "key", ())[1:])


def _err(exc: BaseException | None) -> str:
    return "unknown" if exc is None else f"{type(exc).__name__}: {exc}"
