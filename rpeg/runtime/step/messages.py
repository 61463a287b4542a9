"""The messages of the step scheduler (:mod:`rpeg.runtime.step.scheduler`): the
instructions it emits, the events it takes, and its two errors. Plain frozen data; an
instruction that reports back builds its event with ``ins.done(result)``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import RpegError


class SchedulerError(RpegError):
    """A protocol violation: an event the scheduler did not ask for, or a broken invariant."""


class OutOfMemoryFailure(RpegError):
    """A unit ran out of memory (reported with the unit, never retried)."""


class WorkerLostFailure(RpegError):
    """A worker was lost and the run could not recover (no checkpoint store, or no retry
    left); the worker's own error is its ``__cause__``. Exit code 1: a runtime failure, not
    bad input."""

    exit_code = 1


# --------------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class SyncWeights:
    version: int

    @property
    def key(self) -> tuple[str, int]:
        return ("sync", self.version)

    def done(self, metrics: dict[str, float]) -> WeightsSynced:
        return WeightsSynced(self.version, dict(metrics or {}))


#: ``Evaluate.when`` of a validation after a step: ``"after step 5"`` (runtime.val_every)
STEP_VALIDATION = "after step "


@dataclass(frozen=True)
class Evaluate:
    when: str  # "before" | "after" | "after step <n>" (1-based)

    @property
    def key(self) -> tuple[str, str]:
        return ("evaluate", self.when)

    def done(self, result: float | dict[str, float]) -> Evaluated:
        """``result``: the validation metrics (rpeg.runtime.validation), or an accuracy."""
        if isinstance(result, dict):
            acc = float(result.get("val/accuracy", float("nan")))
            return Evaluated(self.when, acc, dict(result))
        return Evaluated(self.when, float(result))


@dataclass(frozen=True)
class Rollout:
    step: int
    version: int

    @property
    def key(self) -> tuple[str, int]:
        return ("rollout", self.step)

    def done(self, metrics: dict[str, float]) -> RolloutProduced:
        return RolloutProduced(self.step, self.version, dict(metrics or {}))


@dataclass(frozen=True)
class Take:
    step: int
    lags: tuple[int, ...]

    @property
    def key(self) -> tuple[str, int]:
        return ("take", self.step)

    def done(self, metrics: dict[str, float]) -> BatchTaken:
        return BatchTaken(self.step, dict(metrics or {}))


@dataclass(frozen=True)
class RunUnit:
    step: int
    unit: str

    @property
    def key(self) -> tuple[str, int, str]:
        return ("unit", self.step, self.unit)

    def done(self, metrics: dict[str, float]) -> UnitFinished:
        return UnitFinished(self.step, self.unit, dict(metrics or {}))


@dataclass(frozen=True, eq=False)
class Checkpoint:
    step_done: int
    state: dict[str, Any]

    @property
    def key(self) -> tuple[str, int]:
        return ("checkpoint", self.step_done)

    def done(self, metrics: dict[str, float]) -> CheckpointWritten:
        return CheckpointWritten(self.step_done, dict(metrics or {}))


@dataclass(frozen=True)
class BeginStep:
    step: int


@dataclass(frozen=True)
class EndStep:
    step: int


@dataclass(frozen=True)
class Release:
    step: int


@dataclass(frozen=True, eq=False)
class Record:
    step: int
    metrics: dict[str, float]
    checkpoint: int | None = None  # the step count of a checkpoint written after it


@dataclass(frozen=True)
class Recover:
    reason: str


@dataclass(frozen=True)
class Finish:
    acc_before: float | None
    acc_after: float | None


@dataclass(frozen=True, eq=False)
class Fail:
    kind: str  # "worker_lost" | "oom" | "protocol"
    reason: str
    error: BaseException | None = None

    def exception(self) -> BaseException:
        """What the executor raises: a :class:`WorkerLostFailure` naming the unit, why it
        was not recovered and the worker's error (chained as its cause), an
        :class:`OutOfMemoryFailure` naming the unit, or a :class:`SchedulerError`."""
        if self.kind == "worker_lost":
            exc = WorkerLostFailure(self.reason)
            exc.__cause__ = self.error
            return exc
        if self.kind == "oom":
            return OutOfMemoryFailure(self.reason)
        return SchedulerError(self.reason)


Instruction = (
    SyncWeights
    | Evaluate
    | Rollout
    | Take
    | RunUnit
    | Checkpoint
    | BeginStep
    | EndStep
    | Release
    | Record
    | Recover
    | Finish
    | Fail
)
# instructions whose execution reports back with an event (``ins.done(result)``)
Tracked = SyncWeights | Evaluate | Rollout | Take | RunUnit | Checkpoint

# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Start:
    """Begin (``state`` = a checkpoint's scheduler state when resuming, else None)."""

    state: dict[str, Any] | None = None


@dataclass(frozen=True)
class WeightsSynced:
    version: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluated:
    when: str
    accuracy: float
    metrics: dict[str, float] = field(default_factory=dict, hash=False)  # val/<metric>


@dataclass(frozen=True)
class RolloutProduced:
    step: int
    version: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchTaken:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UnitFinished:
    step: int
    unit: str
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepEnded:
    step: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # the executor's, of the step


@dataclass(frozen=True)
class CheckpointWritten:
    step_done: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerLost:
    instruction: Any
    error: BaseException | None = None


@dataclass(frozen=True)
class OutOfMemory:
    instruction: Any
    error: BaseException | None = None


@dataclass(frozen=True)
class Recovered:
    """Actors re-created and the newest checkpoint loaded; ``state`` is its scheduler state."""

    state: dict[str, Any]


Event = (
    Start
    | WeightsSynced
    | Evaluated
    | RolloutProduced
    | BatchTaken
    | UnitFinished
    | StepEnded
    | CheckpointWritten
    | WorkerLost
    | OutOfMemory
    | Recovered
)
