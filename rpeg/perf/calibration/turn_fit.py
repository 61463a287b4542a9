"""The turn shape of a measured multi-turn run (``rpeg calibrate RUN`` of a run with
``task.multiturn.env``; pure: reads the metrics' numbers only). docs/multiturn.md "Fitting
the turn shape from a run".

The rollout records per step (:mod:`rpeg.runtime.envs.rollout`): ``turns_mean`` (model turns
per sample), ``turn_tokens_mean`` (tokens the engine generated per turn, the tail it wrote
after a tool call's close included: what decoding cost), ``observation_tokens_mean`` (ids
appended per observation, a chat template's wrapper included) and ``env_s`` (one rollout
process's seconds in environment calls). From the median over the measured steps:

* ``mean_turns`` = median ``turns_mean``, within ``[1, max_turns]``;
* ``mean_turn_tokens`` = median ``turn_tokens_mean``, at most ``max_turn_tokens``;
* ``observation_tokens`` = median ``observation_tokens_mean`` (kept from the config when no
  step appended an observation);
* ``env_latency_s`` = the median over steps of ``env_s`` / the waves of calls the rollout
  made in that step (:func:`rpeg.perf.turns.env_waves` at the step's ``turns_mean``, the
  process's samples and ``env_concurrency``).

Where they go: printed as the ``task.multiturn`` values to set, and used for the run's own
efficiency fit; not written to calibration.yaml, which holds a cluster's constants (the
turn shape belongs to the task, the model and how far training has got, as a response
length does).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rpeg.perf.turns import Turns, env_waves


@dataclass(frozen=True)
class StepTurns:
    """One measured step's turn figures (None: the metric is not in that line)."""

    turns: float
    turn_tokens: float | None
    observation_tokens: float | None
    env_s: float | None


@dataclass(frozen=True)
class MeasuredTurns:
    """The measured steps of a multi-turn run (those ``rpeg calibrate`` keeps)."""

    steps: tuple[StepTurns, ...]


def _num(h: Mapping[str, Any], key: str) -> float | None:
    v = h.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def measured_turns(rows: Sequence[Mapping[str, Any]]) -> MeasuredTurns | None:
    """The turn figures of metrics.jsonl lines (the measured steps); None when no line has
    ``turns_mean`` (a single-turn run)."""
    steps = []
    for h in rows:
        t = _num(h, "turns_mean")
        if t is None:
            continue
        steps.append(
            StepTurns(
                turns=t,
                turn_tokens=_num(h, "turn_tokens_mean"),
                observation_tokens=_num(h, "observation_tokens_mean"),
                env_s=_num(h, "env_s"),
            )
        )
    return MeasuredTurns(tuple(steps)) if steps else None


def _median(xs: Sequence[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def fitted_turns(t: Turns, m: MeasuredTurns, samples_per_process: float) -> tuple[Turns, list[str]]:
    """``t`` (the config's turns) with the measured shape, and one line per fitted value
    saying where it came from. ``samples_per_process``: the samples one rollout process
    generates per step (the plan's, as the env stage prices them)."""
    n = len(m.steps)
    lines = []
    turns = min(max(statistics.median(s.turns for s in m.steps), 1.0), float(t.max_turns))
    change: dict[str, float] = {"mean_turns": turns}
    lines.append(f"mean_turns {turns:.4g}: median turns_mean over {n} steps")
    g = _median([s.turn_tokens for s in m.steps])
    if g is not None and g > 0:
        change["mean_turn_tokens"] = min(g, float(t.max_turn_tokens))
        lines.append(f"mean_turn_tokens {change['mean_turn_tokens']:.4g}: median turn_tokens_mean")
    else:
        lines.append("mean_turn_tokens: no turn_tokens_mean in metrics.jsonl (kept as configured)")
    o = _median([s.observation_tokens for s in m.steps])
    if o is not None:
        change["observation_tokens"] = o
        lines.append(f"observation_tokens {o:.4g}: median observation_tokens_mean")
    else:
        lines.append("observation_tokens: no step appended an observation (kept as configured)")

    def waves(s: StepTurns) -> float:  # the calls the rollout made in that step
        turns = min(max(s.turns, 1.0), float(t.max_turns))
        return env_waves(samples_per_process, turns, t.env_concurrency)

    per_step = [s.env_s / waves(s) for s in m.steps if s.env_s is not None and waves(s) > 0]
    if per_step:
        change["env_latency_s"] = statistics.median(per_step)
        lines.append(
            f"env_latency_s {change['env_latency_s']:.4g}: median env_s / the step's waves of "
            f"calls ({samples_per_process:g} samples per rollout process, "
            f"{t.env_concurrency} at once)"
        )
    else:
        lines.append("env_latency_s: no env_s in metrics.jsonl (kept as configured)")
    return replace(t, **change), lines


def config_lines(
    t: Turns, transcript_tokens: float | None = None, prompt_tokens: float | None = None
) -> list[str]:
    """The values to put in the run's config so that later predictions of this task use the
    measured shape (YAML keys, dotted as ``rpeg config`` overrides take them), with the
    measured transcript and prompt lengths when given."""
    out = [
        f"task.multiturn.mean_turns: {t.turns:.4g}",
    ]
    if t.mean_turn_tokens is not None:
        out.append(f"task.multiturn.mean_turn_tokens: {t.mean_turn_tokens:.4g}")
    out.append(f"task.multiturn.observation_tokens: {t.observation_tokens:.4g}")
    out.append(f"task.multiturn.env_latency_s: {t.env_latency_s:.4g}")
    if transcript_tokens is not None:
        out.append(f"workload.mean_response_tokens: {transcript_tokens:.4g}")
    if prompt_tokens is not None:
        out.append(f"workload.mean_prompt_tokens: {prompt_tokens:.4g}")
    return out


def samples_per_process(prediction: Any) -> float | None:
    """The samples one rollout process generates per step in a prediction of a multi-turn
    plan (its env stage's), None without one."""
    for st in prediction.stages.values():
        for k, v in st.detail.items():
            if k == "samples_per_process" or k.endswith(".samples_per_process"):
                return float(v)
    return None


def fit_workload(workload: Any, m: MeasuredTurns, predict_fn: Any) -> tuple[Any, list[str]]:
    """``workload`` (a multi-turn :class:`rpeg.perf.prediction.Workload`) at the measured
    turn shape, and the lines saying what was fitted. ``predict_fn(calib)``: the run's
    prediction (what tells the samples per rollout process)."""
    from rpeg.perf.calibration import SHIPPED

    n = samples_per_process(predict_fn(SHIPPED))
    turns, lines = fitted_turns(workload.turns, m, float(workload.samples) if n is None else n)
    return replace(workload, turns=turns), lines
