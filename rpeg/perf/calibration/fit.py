"""Fit this machine's calibration from a measured run (``rpeg calibrate runs/<run>``).

The runtime writes, into the run's output folder, ``timeline.json`` (``records``: one
:class:`rpeg.perf.timeline.TimelineRecord` per execution unit per step, measured) and
``metrics.jsonl`` (one object per step with ``step_s``). From the median over the steps
after the first (warm-up), the fit sets, relative to the shipped constants:

* ``gen_eff_scale`` / ``train_eff_scale`` / ``fwd_eff_scale``: predicted / measured time of
  the generation, training and forward-only units (the achieved share of the modelled rate);
* ``fitted_host_per_sample_s``: the measured rule-reward units' seconds per sample (the host
  work of scoring; GPU stacks that detokenise long traces pay ms, rpeg's CPU runtime us);
* ``fitted_collective_latency_s``: given (``collective_s``), the latency of one collective call
  inside a pass that ``benchmarks/bench_collectives.py`` measured on this machine; the units
  are priced with it before the scales are fitted, and it stays for later calibrations that
  do not measure it again;
* ``fitted_step_overhead_s``: measured step minus the step predicted with those scales and no
  step overhead (what the runtime spends outside the units), at least 0; or, given the
  runtime's own seconds per step that ``benchmarks/bench_overhead.py`` measured on this
  cluster (``runtime_s``: step wall minus the stages' own time), that figure less the
  dispatch the model already prices per unit -- measured, not a residual that would also
  carry the model's error on the units.

They are written to the user's ``calibration.yaml`` under the cluster's name; every later
prediction on that cluster that uses the default calibration picks them up
(:func:`rpeg.perf.calibration.machine_calibration`). Pure: reads JSON/YAML only.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rpeg.errors import Problem, ProblemsError
from rpeg.perf.calibration import SHIPPED, Calibration, user_calibration_file
from rpeg.perf.calibration.run_lengths import LENGTHS_KEY, sigma_for_cap_share, sigma_for_max
from rpeg.perf.calibration.turn_fit import MeasuredTurns, fit_workload, measured_turns
from rpeg.perf.calibration.turn_store import TURNS_KEY
from rpeg.perf.units import FWD_KINDS, GEN_KIND, TRAIN_KINDS

SCALE_RANGE = (0.01, 100.0)


class RunDataError(ProblemsError):
    title = "run folder cannot be calibrated on"


@dataclass
class MeasuredRun:
    unit_s: dict[str, float]  # unit (stage) name -> median seconds per step
    step_s: float  # median measured step
    steps: int  # steps used
    # the fastest and slowest of those steps: how far one run's steps spread on this machine
    step_range: tuple[float, float] | None = None
    # medians over the same steps of what the batch held: prompt + response tokens of the
    # step's batch (``num_tokens``) and its mean response length (``response_length``)
    tokens_per_step: float | None = None
    response_tokens: float | None = None
    response_max: float | None = None  # the step's longest response (``response_length_max``)
    # the mean over the same steps of the share of responses cut at the cap (``truncated_frac``)
    truncated: float | None = None
    # a multi-turn run's per-step turn figures (rpeg.perf.calibration.turn_fit); None: single turn
    turns: MeasuredTurns | None = None


def measured_workload(workload: Any, measured: MeasuredRun) -> Any:
    """``workload`` with the run's measured mean response and prompt lengths in place of
    what the config states or leaves to the prior (a config that caps prompts at 32 tokens
    and says nothing of their mean is priced at 32; the built-in task's prompts are ~6).
    Fitting efficiencies against the wrong token count would bake the length error into the
    scales, which then do not transfer to a run with other lengths."""
    r = measured.response_tokens
    if r is None or r <= 0:
        return workload
    change: dict[str, float] = {"mean_response_tokens": r}
    if measured.tokens_per_step and workload.samples:
        prompt = measured.tokens_per_step / workload.samples - r
        if prompt > 0:
            change["mean_prompt_tokens"] = prompt
    if measured.response_max:  # the spread: the longest of a step's samples
        cap = float(workload.max_response_tokens)
        sigma = sigma_for_max(r, measured.response_max, workload.samples, cap)
        if sigma is None and measured.response_max >= cap and measured.truncated:
            # the longest at the cap says only "at least this much spread"; the share cut
            # there says how much (a LoRA run at 10x lr truncated 0.6% of its responses, so
            # most steps decoded to the 16-token cap: priced at the calibrating run's
            # spread, generate came out 0.16 s against 0.30 s measured)
            sigma = sigma_for_cap_share(r, measured.truncated, cap)
        if sigma is not None:
            change["length_sigma"] = sigma
    return replace(workload, **change)


def run_workload(graph: Any, plan: Any, workload: Any, measured: MeasuredRun) -> Any:
    """``workload`` at everything the run measured of what it ran: a multi-turn run's turn
    shape (:func:`rpeg.perf.calibration.turn_fit.fit_workload`) and the lengths
    (:func:`measured_workload`) -- what ``rpeg bench`` prices each run at. A tool-use run
    priced at its config's turn shape instead came out 49% over its measured step
    (configs/tool-cpu.yaml, 2026-12-06); at its own, 22%."""
    if workload.turns is not None and measured.turns is not None:
        pred = predictor(graph, plan, workload, measured)
        workload, _ = fit_workload(workload, measured.turns, pred)
    return measured_workload(workload, measured)


def _step_index(h: dict, i: int) -> int:
    """The 0-based step index of line ``i`` of metrics.jsonl (the timeline's ``step``):
    ``step`` is an integer counted from 1, as the console counts; a float ``step`` is a file
    written before that change (counted from 0)."""
    v = h.get("step")
    if v is None:
        return i
    return int(v) if isinstance(v, float) else int(v) - 1


#: a leading step slower than this times the median of the run's second half is warm-up
WARM_UP_FACTOR = 1.25


def settled(keep: set[int], step_s: dict[int, Any]) -> set[int]:
    """``keep`` without its leading steps that are still warming up: slower than
    :data:`WARM_UP_FACTOR` x the median step of the second half of ``keep`` (allocator and
    page-cache warm-up, a machine that just started its other processes: a calibration run
    on this 2-core VM took 2.7-3.4 s in steps 2-4 and 1.0-1.4 s after, 2026-12-03 07:30
    UTC). At least the second half is kept; steps without a ``step_s`` are kept."""
    order = sorted(keep)
    times = [float(step_s[k]) for k in order if isinstance(step_s.get(k), (int, float))]
    if len(times) < 4:
        return keep
    limit = WARM_UP_FACTOR * statistics.median(times[len(times) // 2 :])
    drop = set()
    for k in order[: len(order) // 2]:
        t = step_s.get(k)
        if not isinstance(t, (int, float)) or t <= limit:
            break
        drop.add(k)
    return keep - drop


def read_run(run_dir: str | Path, skip: int = 1) -> MeasuredRun:
    """Median unit and step times of a run folder: the first ``skip`` steps left out when the
    run has more, and the warm-up beyond them (:func:`settled`)."""
    d = Path(run_dir)
    problems = []
    tl, mj = d / "timeline.json", d / "metrics.jsonl"
    for p in (tl, mj):
        if not p.is_file():
            problems.append(Problem(str(p), "missing (written by `rpeg train` / the train flow)"))
    if problems:
        raise RunDataError(problems)
    try:
        records = json.loads(tl.read_text()).get("records", [])
        hist = [json.loads(x) for x in mj.read_text().splitlines() if x.strip()]
    except (ValueError, AttributeError) as exc:
        raise RunDataError([Problem(str(d), f"unreadable JSON: {exc}")]) from None
    steps = sorted({_step_index(h, i) for i, h in enumerate(hist)})
    keep = set(steps[skip:]) if len(steps) > skip else set(steps)
    keep = settled(keep, {_step_index(h, i): h.get("step_s") for i, h in enumerate(hist)})
    step_s = [
        float(h["step_s"])
        for i, h in enumerate(hist)
        if "step_s" in h and _step_index(h, i) in keep
    ]
    per: dict[str, dict[int, float]] = {}
    for r in records:
        if r.get("source", "measured") != "measured" or int(r.get("step", 0)) not in keep:
            continue
        d_s = float(r["end_s"]) - float(r["start_s"])
        unit = per.setdefault(str(r["stage"]), {})
        unit[int(r["step"])] = unit.get(int(r["step"]), 0.0) + d_s
    if not step_s:
        raise RunDataError([Problem(str(mj), "no step with a step_s")])

    def values(key: str) -> list[float]:
        return [
            float(h[key])
            for i, h in enumerate(hist)
            if isinstance(h.get(key), (int, float)) and _step_index(h, i) in keep
        ]

    def med(key: str) -> float | None:
        xs = values(key)
        return statistics.median(xs) if xs else None

    cut = values("truncated_frac")

    return MeasuredRun(
        unit_s={k: statistics.median(v.values()) for k, v in per.items()},
        step_s=statistics.median(step_s),
        steps=len(step_s),
        step_range=(min(step_s), max(step_s)),
        tokens_per_step=med("num_tokens"),
        response_tokens=med("response_length"),
        response_max=med("response_length_max"),
        truncated=statistics.fmean(cut) if cut else None,  # rare: a median would say 0
        turns=measured_turns([h for i, h in enumerate(hist) if _step_index(h, i) in keep]),
    )


def predictor(graph: Any, plan: Any, workload: Any, measured: MeasuredRun | None = None) -> Any:
    """``calib -> StepPrediction`` for a run's plan, on its cluster sized to the plan's devices
    (a run config names the cluster and how many of its devices it uses); with ``measured``,
    at the run's measured lengths (:func:`measured_workload`)."""
    from rpeg.perf.pricing import predict
    from rpeg.perf.time_sharing import run_cluster

    if measured is not None:
        workload = measured_workload(workload, measured)
    # CPU: the machine's cores, the workers beyond them time-share (perf.time_sharing)
    cl = run_cluster(plan.cluster, plan.num_devices)
    return lambda cal: predict(graph, plan, workload, cluster=cl, calib=cal)


def _class(kinds: tuple[str, ...]) -> str | None:
    if GEN_KIND in kinds:
        return "gen"
    if any(k in TRAIN_KINDS for k in kinds):
        return "train"
    if any(k in FWD_KINDS for k in kinds):
        return "fwd"
    return None


def fit(
    predict_fn: Any,
    measured: MeasuredRun,
    base: Calibration = SHIPPED,
    runtime_s: float | None = None,
    collective_s: float | None = None,
) -> tuple[dict[str, float], list[str]]:
    """The fitted values and one line per fitted quantity. ``predict_fn(calib)`` predicts
    the measured run's plan with ``calib``; ``runtime_s``: the runtime's own seconds per
    step measured by ``benchmarks/bench_overhead.py``; ``collective_s``: one collective
    call's latency measured by ``benchmarks/bench_collectives.py`` (module docstring)."""
    for name, v in (("runtime_s", runtime_s), ("collective_s", collective_s)):
        if v is not None and not (v >= 0.0):
            raise RunDataError([Problem(name, f"{v!r}: allowed a number >= 0")])
    out: dict[str, float] = {}
    lines = []
    if collective_s is not None:  # a fixed cost of the units: in place before the fit
        base = replace(base, fitted_collective_latency_s=collective_s)
        out["fitted_collective_latency_s"] = collective_s
        lines.append(f"collective call: {1e3 * collective_s:.4g} ms (measured)")
    pred = predict_fn(base)
    # priced again at twice the rates: the part of a unit that halves is the work the
    # scale applies to; the rest (dispatch, and on CPU workers the gloo collectives,
    # rpeg.perf.eager_cpu.scaled) is fixed
    keys = ("gen_eff_scale", "train_eff_scale", "fwd_eff_scale")
    fast = predict_fn(replace(base, **{k: 2.0 * getattr(base, k) for k in keys}))
    sums: dict[str, list[float]] = {}
    for name, st in pred.stages.items():
        cls = _class(st.kinds)
        if cls is None or name not in measured.unit_s:
            continue
        work = 2.0 * (st.time_s - fast.stages[name].time_s)
        s = sums.setdefault(cls, [0.0, 0.0])
        s[0] += work
        s[1] += measured.unit_s[name] - (st.time_s - work)
        lines.append(f"{name}: predicted {st.time_s:.4g} s, measured {measured.unit_s[name]:.4g} s")
    if not sums:
        raise RunDataError(
            [
                Problem(
                    "timeline.json",
                    "no measured unit matches a predicted one "
                    f"(predicted: {', '.join(pred.stages)}; measured: {', '.join(measured.unit_s) or 'none'})",
                )
            ]
        )
    for cls, (p, m) in sums.items():
        if m > 0 and p > 0:
            out[f"{cls}_eff_scale"] = min(max(p / m, SCALE_RANGE[0]), SCALE_RANGE[1])
        elif p > 0:
            # measured at or below the fixed part (dispatch, CPU collectives): the closest
            # fit is the fixed part alone, not the shipped scale
            out[f"{cls}_eff_scale"] = SCALE_RANGE[1]
            lines.append(
                f"{cls} units: measured at or below their fixed part (collectives, dispatch); "
                f"{cls}_eff_scale set to its bound {SCALE_RANGE[1]:g}"
            )
    host = _host_per_sample(predict_fn, base, measured)
    if host is not None:
        out["fitted_host_per_sample_s"] = host
        lines.append(f"rule reward: {1e3 * host:.4g} ms of host work per sample")
    scaled = replace(base, **out, fitted_step_overhead_s=0.0)
    if runtime_s is not None:  # measured: the units' dispatch is priced already
        dispatch = sum(st.detail.get("dispatch_s", 0.0) for st in pred.stages.values())
        out["fitted_step_overhead_s"] = max(0.0, runtime_s - dispatch)
        lines.append(
            f"step overhead: the runtime's own {1e3 * runtime_s:.4g} ms per step (measured) "
            f"less {1e3 * dispatch:.4g} ms of unit dispatch = "
            f"{1e3 * out['fitted_step_overhead_s']:.4g} ms"
        )
        return out, lines
    rest = measured.step_s - predict_fn(scaled).step_s
    out["fitted_step_overhead_s"] = max(0.0, rest)
    lines.append(
        f"step: measured {measured.step_s:.4g} s over {measured.steps} steps; "
        f"outside the units {out['fitted_step_overhead_s']:.4g} s"
    )
    return out, lines


def _host_per_sample(predict_fn: Any, base: Calibration, measured: MeasuredRun) -> float | None:
    """Seconds of host work per sample from the measured rule-reward units: the units whose
    predicted time grows with the per-sample host cost (priced at 1 s and 2 s per sample, the
    difference is the unit's sample count). A reward model's forward does not grow with it;
    a reward fused into generation is left to the generation scale."""
    one = predict_fn(replace(base, fitted_host_per_sample_s=1.0)).stages
    two = predict_fn(replace(base, fitted_host_per_sample_s=2.0)).stages
    samples = spent = 0.0
    for name, st in one.items():
        n = two[name].time_s - st.time_s
        if st.kinds == ("reward",) and n >= 1.0 and name in measured.unit_s:
            samples += n
            spent += measured.unit_s[name]
    return spent / samples if samples else None


def write(cluster: str, values: dict[str, float], source: str, path: Path | None = None) -> Path:
    """Store ``values`` for ``cluster`` in the user's calibration.yaml (other clusters kept)."""
    import yaml

    path = path or user_calibration_file()
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    data = data if isinstance(data, dict) else {}
    entry = {k: round(float(v), 6) for k, v in values.items()}
    entry["source"] = f"{source} ({time.strftime('%Y-%m-%d')})"
    old = data.setdefault("clusters", {}).get(cluster)
    # the tasks' lengths and turn shapes, and a machine figure measured on its own, kept
    for key in (LENGTHS_KEY, TURNS_KEY, "fitted_collective_latency_s"):
        if isinstance(old, dict) and key in old and key not in entry:
            entry[key] = old[key]
    data["clusters"][cluster] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
