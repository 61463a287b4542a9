"""What a recovery generates again: the samples whose generation had begun when a worker
was lost -- finished, or half-way (a multi-turn sample between its turns) -- that the
checkpoint the run goes back to does not hold. They are regenerated from the same per-row
seeds with the same weights, so the run's results do not change; the count is reported as
the summary's ``regenerated_samples`` (docs/faults.md "Multi-turn runs"). Pure."""

from __future__ import annotations

from typing import Any


def begun_samples(sched: Any) -> frozenset[int]:
    """Sample indices (in admission order, ``B`` per step) whose generation had begun in
    ``sched`` (a :class:`rpeg.runtime.step.scheduler.StepScheduler` at the loss, before
    its phase changes). Async rollouts: every admitted index but the reservations waiting
    to be reissued. Synchronous: the samples of the steps before the current one, and of
    the current one when its units were issued (phase ``step``: generation comes first)."""
    b = sched.B
    if sched.plan.async_rollout:
        s = sched.staleness
        return frozenset(range(s.next_index)) - frozenset(s.reissue)
    return frozenset(range((sched.step + (sched.phase == "step")) * b))


def regenerated(begun: frozenset[int], restored: dict[str, Any], b: int) -> int:
    """How many of ``begun`` the run generates again after going back to ``restored`` (a
    scheduler state: a checkpoint's, or the run's start): those neither trained before it
    nor in its buffer of produced samples."""
    ready = restored.get("staleness", {}).get("ready", ())
    kept = set(range(int(restored["step"]) * b)) | {int(i) for i, _v, _p in ready}
    return len(begun - kept)
