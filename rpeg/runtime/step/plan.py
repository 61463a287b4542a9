"""What the step scheduler needs of a compiled step (:class:`StepPlan`): the units it issues
per step with the units each waits for, whether rollouts run on a group of their own, the
staleness bound k, the samples of a step and how often weights are synced. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.compile.step import CompiledStep, TaskSpec
from rpeg.ir import StageKind


@dataclass(frozen=True)
class UnitWait:
    """A unit the scheduler issues and the units of the same step it waits for."""

    name: str
    deps: tuple[str, ...]  # units of the same step that must finish first


@dataclass(frozen=True)
class StepPlan:
    """What the scheduler needs of a :class:`rpeg.compile.CompiledStep` (plain data)."""

    units: tuple[UnitWait, ...]  # in topological order; async: the train-phase units
    async_rollout: bool
    k: int
    samples_per_step: int
    sync_every: int = 1

    @classmethod
    def from_compiled(cls, compiled: CompiledStep) -> StepPlan:
        async_rollout = compiled.async_rollout
        if async_rollout:  # rollout units run inside Rollout; the bucketed sync replaces
            tasks = [t for t in compiled.tasks_in("train") if StageKind.sync_weights not in t.kinds]
        else:
            tasks = list(compiled.tasks)
        names = {t.name for t in tasks}
        units = tuple(
            UnitWait(t.name, tuple(d for d in _waits(compiled, t) if d in names)) for t in tasks
        )
        return cls(
            units=units,
            async_rollout=async_rollout,
            k=compiled.staleness,
            samples_per_step=compiled.buffer.samples_per_step,
            sync_every=compiled.weight_sync.every_steps,
        )


def _waits(compiled: CompiledStep, t: TaskSpec) -> list[str]:
    """Units ``t`` waits for inside a step (the compiled step's ``wait_list``)."""
    return list(compiled.wait_list(t.name))
