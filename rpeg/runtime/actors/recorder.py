"""Measured timeline records in the performance model's schema (rpeg.perf.timeline)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rpeg.perf.timeline import TimelineRecord

#: steps whose pipeline actions timeline.json keeps (the newest): a pipelined trainer records
#: 2 x micro-batches x chunks actions per mini-batch and rank, too many to keep for every step
#: of a long run; a Gantt needs one step
PIPELINE_ACTION_STEPS = 3


class TimelineRecorder:
    """Collects (stage, device group, start_s, end_s) per step; thread-safe (tasks of one
    step run on Prefect's thread pool). Times are seconds from the step's start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[TimelineRecord] = []
        self.origin = time.perf_counter()
        self.origin_wall = time.time()
        self._step_start: dict[int, float] = {}
        self._begun: dict[int, float] = {}
        # stages inside an actor call (wall clock of the actor's process, same host clock):
        # {"step", "unit", "stage", "rank", "pid", "start_s", "end_s"}, seconds from origin
        self.stage_spans: list[dict[str, Any]] = []
        # a pipelined trainer's actions (rpeg.runtime.pipeline), one per forward/backward of
        # a model chunk on a micro-batch: {"step", "unit", "rank", "kind", "chunk", "micro",
        # "start_s", "end_s", "wait_s"}, seconds from origin (wait_s: on its receives)
        self.pipeline_actions: list[dict[str, Any]] = []

    def add_pipeline_actions(self, step: int, unit: str, rank: int, actions: Iterable[Any]) -> None:
        """``actions``: one rank's :class:`rpeg.runtime.actors.unit_result.PipelineAction`s;
        only the newest :data:`PIPELINE_ACTION_STEPS` steps' are kept."""
        with self._lock:
            for a in actions:
                self.pipeline_actions.append(
                    {
                        "step": step,
                        "unit": unit,
                        "rank": rank,
                        "kind": a.kind,
                        "chunk": a.chunk,
                        "micro": a.micro,
                        "start_s": round(a.start - self.origin_wall, 6),
                        "end_s": round(a.end - self.origin_wall, 6),
                        "wait_s": round(a.wait, 6),
                    }
                )
            steps = sorted({a["step"] for a in self.pipeline_actions})
            if len(steps) > PIPELINE_ACTION_STEPS:
                keep = set(steps[-PIPELINE_ACTION_STEPS:])
                self.pipeline_actions = [a for a in self.pipeline_actions if a["step"] in keep]

    def add_stage_spans(
        self, step: int, unit: str, rank: int, pid: int, spans: Iterable[tuple[str, float, float]]
    ) -> None:
        """``spans``: ``[(stage kind, wall start, wall end), ...]`` from one rank's call."""
        with self._lock:
            for kind, a, b in spans:
                self.stage_spans.append(
                    {
                        "step": step,
                        "unit": unit,
                        "stage": kind,
                        "rank": rank,
                        "pid": pid,
                        "start_s": round(a - self.origin_wall, 6),
                        "end_s": round(b - self.origin_wall, 6),
                    }
                )

    def perf_of_wall(self, wall: float) -> float:
        """A wall-clock time (``time.time()``, e.g. a rank's span) on this recorder's
        ``perf_counter`` clock."""
        return self.origin + (wall - self.origin_wall)

    def start_step(self, step: int) -> None:
        """The origin of ``step``'s records: its first unit (a rollout may run steps ahead)."""
        with self._lock:
            self._step_start.setdefault(step, time.perf_counter())

    def step_offsets(self) -> dict[int, float]:
        """Seconds from the run's origin to each step's first unit."""
        with self._lock:
            return {s: t - self.origin for s, t in self._step_start.items()}

    def begin_step(self, step: int) -> None:
        """The trainer begins ``step`` (the flow's clock for the step's wall time)."""
        with self._lock:
            self._begun[step] = time.perf_counter()

    def end_step(self, step: int) -> float:
        """Seconds since :meth:`begin_step` of ``step``."""
        with self._lock:
            return time.perf_counter() - self._begun.pop(step)

    def add(
        self, step: int, stage: str, device_group: str, t0: float, t1: float, kind: str = ""
    ) -> None:
        with self._lock:
            base = self._step_start.setdefault(step, t0)
            self.records.append(
                TimelineRecord(
                    stage=stage,
                    device_group=device_group,
                    start_s=round(t0 - base, 6),
                    end_s=round(t1 - base, 6),
                    step=step,
                    kind=kind,
                    source="measured",
                )
            )

    @contextmanager
    def span(self, step: int, stage: str, device_group: str, kind: str = "") -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(step, stage, device_group, t0, time.perf_counter(), kind)
