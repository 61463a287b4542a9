"""The invariants of the step scheduler, checked by :meth:`SchedulerInvariants.validate`
after every event in the tests (modelled on ``validate_state()`` of dask's worker state
machine): steps and history, dependencies of the units run, work in flight per phase and, in
an async run, the rollout window, versions and the staleness of every buffered sample. A
mixin of :class:`rpeg.runtime.step.scheduler.StepScheduler`. Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rpeg.runtime.step import staleness as st
from rpeg.runtime.step.messages import SchedulerError

if TYPE_CHECKING:
    from rpeg.runtime.step.plan import StepPlan


class SchedulerInvariants:
    """``validate`` over the scheduler's state (its attributes: see StepScheduler)."""

    # what validate reads of StepScheduler (declarations for the type checker; no values)
    plan: StepPlan
    staleness: st.StalenessState
    step: int
    steps: int
    phase: str
    history: dict[int, dict[str, float]]
    rollout_metrics: dict[int, dict[str, float]]
    recoveries: int
    max_recoveries: int
    unit_names: tuple[str, ...]
    done: set[str]
    in_flight: dict[tuple[Any, ...], Any]
    trained: bool
    B: int
    _window_end: Callable[[], int]

    def validate(self) -> None:
        """Raise :class:`SchedulerError` if an invariant does not hold (tests call it after
        every event)."""
        s = self.staleness
        errs: list[str] = []

        def need(cond: bool, msg: str) -> None:
            if not cond:
                errs.append(msg)

        need(0 <= self.step <= self.steps, f"step {self.step} outside [0, {self.steps}]")
        need(sorted(self.history) == list(range(len(self.history))), "history has gaps")
        need(len(self.history) == self.step, f"{len(self.history)} steps recorded at {self.step}")
        need(self.recoveries <= self.max_recoveries, "more recoveries than allowed")
        need(not self.done - {*self.unit_names, "take"}, f"unknown done units {self.done}")
        for u in self.plan.units:
            if u.name in self.done or ("unit", self.step, u.name) in self.in_flight:
                need(all(d in self.done for d in u.deps), f"{u.name} ran before {u.deps}")
        for key in self.in_flight:
            need(key[0] != "unit" or key[1] == self.step, f"{key} in flight at step {self.step}")
            need(key[0] != "unit" or key[2] not in self.done, f"{key} in flight and done")
        if self.phase in ("done", "failed", "recovering", "new"):
            need(not self.in_flight, f"{self.phase} with work in flight {list(self.in_flight)}")
        if self.phase == "done":
            need(self.step == self.steps, "finished before the last step")
        if self.plan.async_rollout and self.phase != "new":
            rolling = [k for k in self.in_flight if k[0] == "rollout"]
            need(len(rolling) <= 1, f"more than one rollout in flight: {rolling}")
            for key in rolling:
                need(key[1] <= self._window_end(), f"rollout {key[1]} beyond the window")
            v = s.trainer_version
            need(v in (self.step, self.step + 1), f"trainer version {v} at step {self.step}")
            need(v == self.step + 1 or not self.trained or self.phase != "step", "no publish")
            need(s.generator_version <= v, "generators ahead of the trainer")
            for smp in s.ready.values():
                lag = s.step_of(smp.index) - smp.version
                ok = lag >= 0 and st.within_bound(s.step_of(smp.index), smp.version, self.plan.k)
                need(ok, f"sample {smp.index} lag {lag} > k={self.plan.k}")
            need(set(self.rollout_metrics) >= {smp.payload for smp in s.ready.values()}, "lost")
            took = "take" in self.done or ("take", self.step) in self.in_flight
            taken = self.step + (1 if took else 0)
            if self.phase in ("step", "checkpoint", "finishing", "done"):
                need(s.delivered == taken * self.B, f"delivered {s.delivered} at step {taken}")
        if errs:
            raise SchedulerError("; ".join(errs))
