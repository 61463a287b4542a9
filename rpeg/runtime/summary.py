"""The run summary: one definition for every trainer (the distributed flow, the
single-process trainer, the retrain flow)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: a run's summary, what every trainer returns (``rpeg.flows.entry.train``): the keys of
#: :data:`SUMMARY_KEYS` from :func:`run_summary`, plus what the runtime adds (``steps_run``,
#: ``recoveries``, ``peak_memory``, ``weight_sync_bytes``, ...; docs/runtime.md "Python entry")
Summary = dict[str, Any]

SUMMARY_KEYS = (
    "steps",
    "wall_s",
    "segment_wall_s",
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
    resumed_at: int = 0,
) -> dict[str, Any]:
    """``history``: one metrics dict per finished step (a list in step order, or a dict
    keyed by step). ``median_step_s`` is over the steps that report ``step_s``.
    ``reward_first10`` / ``reward_last10``: the mean reward of the first and the last
    ``window`` steps; a run shorter than two windows compares its first and last halves
    (disjoint: a 6-step run's steps 1-3 vs 4-6), never a window with itself.

    ``wall_s``: this call's wall time. After a resume (``resumed_at``: the steps restored from
    the checkpoint) the summary's ``wall_s`` is the run's in all: this call's plus the
    restored steps' ``step_s`` (earlier calls' start-up and the steps lost after their last
    checkpoint are not recorded anywhere, so not counted); ``segment_wall_s`` is this call's."""
    if isinstance(history, Mapping):
        history = [history[s] for s in sorted(history)]
    rewards = [float(h.get("reward_mean", 0.0)) for h in history]
    window = max(1, min(window, len(history) // 2))  # first and last windows disjoint
    times = [float(h["step_s"]) for h in history if "step_s" in h]
    before = sum(float(h.get("step_s", 0.0)) for h in history[:resumed_at])
    out = {
        "steps": len(history),
        "wall_s": float(wall_s) + before,
        "segment_wall_s": float(wall_s),
        "median_step_s": statistics.median(times) if times else 0.0,
        "reward_first10": _mean(rewards[:window]),
        "reward_last10": _mean(rewards[-window:]),
        "heldout_acc_before": acc_before,
        "heldout_acc_after": acc_after,
    }
    out.update(_mismatch_and_lag(history))
    tools = [float(h["tool_use_rate"]) for h in history if "tool_use_rate" in h]
    if tools:  # multi-turn tool tasks (rpeg.runtime.envs.rollout)
        out["tool_use_rate_first10"] = _mean(tools[:window])
        out["tool_use_rate_last10"] = _mean(tools[-window:])
    return out


def resumed_timeline(path: Path, timeline: dict[str, Any], resumed_at: int) -> dict[str, Any]:
    """``timeline.json``'s content after a resume: the earlier file at ``path``'s records,
    step offsets and stage spans of the steps before ``resumed_at`` (the restored ones; a step
    re-run after the checkpoint keeps only this call's), then this call's ``timeline``.
    ``segments`` lists each call's first step (offsets and spans are from that call's start).
    A fresh run (``resumed_at`` 0), or no readable earlier file: this call's alone."""
    earlier: dict[str, Any] = {}
    if resumed_at > 0:
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError):
            earlier = {}
    if not isinstance(earlier, dict):
        earlier = {}

    def kept(key: str) -> list[Any]:
        got = earlier.get(key, [])
        ok = isinstance(got, list) and all(isinstance(r, dict) for r in got)
        return [r for r in got if int(r.get("step", 0)) < resumed_at] if ok else []

    offsets = earlier.get("step_offsets_s", {})
    offsets = offsets if isinstance(offsets, dict) else {}
    segments = [s for s in earlier.get("segments", [0]) if isinstance(s, int) and s < resumed_at]
    return {
        **timeline,
        "records": kept("records") + list(timeline.get("records", [])),
        "step_offsets_s": {
            **{k: v for k, v in offsets.items() if int(k) < resumed_at},
            **timeline.get("step_offsets_s", {}),
        },
        "stage_spans": kept("stage_spans") + list(timeline.get("stage_spans", [])),
        "pipeline_actions": kept("pipeline_actions") + list(timeline.get("pipeline_actions", [])),
        "segments": [*segments, resumed_at] if resumed_at > 0 else [0],
    }


def heldout_phrase(summary: Mapping[str, Any]) -> str:
    """The summary's held-out accuracy for a person: ``before -> after``, or why there is none
    (a one-row data set holds nothing out: it printed ``nan -> nan``)."""
    before, after = summary.get("heldout_acc_before"), summary.get("heldout_acc_after")
    if before is None and after is not None and not math.isnan(after):
        return f"held-out greedy accuracy after RL {after:.3f} (runtime.val_before_train: false)"
    if before is None or after is None or math.isnan(before) or math.isnan(after):
        return (
            "no held-out accuracy (the held-out set is empty: task.heldout_size takes at most "
            "half of a data file's rows)"
        )
    return f"held-out greedy accuracy {before:.3f} -> {after:.3f}"


#: the run summary's rollout/trainer mismatch and lag figures: the mean over the steps that
#: measured them, the largest for the ``_max`` ones (rpeg.runtime.algorithms.mismatch, lags)
MISMATCH_SUMMARY_KEYS = (
    "logprob_mismatch_mean",
    "logprob_mismatch_k3",
    "logprob_mismatch_frac_over",
    "logprob_mismatch_max",
    "staleness_lag_mean",
    "staleness_lag_max",
    "staleness_update_lag_max",
)


def _mismatch_and_lag(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in MISMATCH_SUMMARY_KEYS:
        vals = [float(h[key]) for h in history if key in h]
        if vals:
            out[key] = max(vals) if key.endswith("_max") else _mean(vals)
    return out


def distributed_summary(
    groups: Sequence[Any],
    rank_info: Mapping[str, Sequence[tuple[Mapping[str, Any], Any]]],
    sync_log: Sequence[Mapping[str, float]],
    hist: Sequence[Mapping[str, float]],
) -> dict[str, Any]:
    """Run-summary fields of the distributed runtime: per-step medians of the bytes through
    the flow process, of the batch and moved actor to actor, the weight syncs' median bytes
    and seconds (the initial sync, step -1, only when there is no other), and each actor
    group's layout (``groups``: the compiled step's) with what its ranks hold (``rank_info``:
    per group, each rank's ``(layout_info, memory_info)``)."""

    def med(key: str) -> float:
        vals = [h[key] for h in hist if key in h]
        return float(statistics.median(vals)) if vals else 0.0

    syncs = [x for x in sync_log if x["step"] >= 0] or list(sync_log)
    layout, per_rank, full, peak = {}, {}, 0, {}
    for g in groups:
        layout[g.name] = {
            "dp": g.dp,
            "tp": g.tp,
            "ep": g.ep,
            "pp": g.pp,
            "cp": g.cp,
            "pp_schedule": g.pp_schedule,
            "fsdp": g.fsdp,
            "reshard_after_forward": g.reshard_after_forward,
            "gen_tp": g.gen_tp,
            "devices": list(g.devices),
            "device_type": g.device_type,
            "dtype": g.dtype,
            "roles": list(g.roles),
        }
        ranks = rank_info.get(g.name)
        if not ranks:
            continue
        per_rank[g.name] = [i["param_bytes_per_rank"]["total"] for i, _ in ranks]
        layout[g.name]["cpu_cores"] = [i.get("cpu_cores", []) for i, _ in ranks]
        full = max(full, ranks[0][0]["full_param_bytes"]["total"])
        peak[g.name] = [m for _, m in ranks]

    def sync_median(key: str) -> float:
        if not syncs:  # syncs inside a rank (its own vLLM engine) are step metrics
            return med(key)
        return float(statistics.median([x[key] for x in syncs]))

    return {
        "layout": layout,
        "param_bytes_per_rank": per_rank,
        "full_param_bytes": full,
        "peak_memory": peak,
        "driver_bytes_per_step": med("driver_bytes"),
        "batch_bytes_per_step": med("batch_bytes"),
        "actor_to_actor_bytes_per_step": med("actor_to_actor_bytes"),
        "weight_sync_bytes": sync_median("weight_sync_bytes"),
        "weight_sync_s": sync_median("weight_sync_s"),
    }
