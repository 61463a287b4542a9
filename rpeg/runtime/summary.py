"""The run summary: one definition for every trainer (the distributed flow, the
single-process trainer, the retrain flow)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

SUMMARY_KEYS = (
    "steps",
    "wall_s",
    "median_step_s",
    "reward_first10",
    "reward_last10",
    "heldout_acc_before",
    "heldout_acc_after",
)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def run_summary(
    history: Sequence[Mapping[str, Any]] | Mapping[int, Mapping[str, Any]],
    *,
    wall_s: float,
    acc_before: float | None,
    acc_after: float | None,
    window: int = 10,
) -> dict[str, Any]:
    """``history``: one metrics dict per finished step (a list in step order, or a dict
    keyed by step). ``median_step_s`` is over the steps that report ``step_s``."""
    if isinstance(history, Mapping):
        history = [history[s] for s in sorted(history)]
    rewards = [float(h.get("reward_mean", 0.0)) for h in history]
    times = [float(h["step_s"]) for h in history if "step_s" in h]
    return {
        "steps": len(history),
        "wall_s": float(wall_s),
        "median_step_s": statistics.median(times) if times else 0.0,
        "reward_first10": _mean(rewards[:window]),
        "reward_last10": _mean(rewards[-window:]),
        "heldout_acc_before": acc_before,
        "heldout_acc_after": acc_after,
    }
