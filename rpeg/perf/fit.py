"""Fit this machine's calibration from a measured run (``rpeg calibrate runs/<run>``).

The runtime writes, into the run's output folder, ``timeline.json`` (``records``: one
:class:`rpeg.perf.timeline.TimelineRecord` per execution unit per step, measured) and
``metrics.jsonl`` (one object per step with ``step_s``). From the median over the steps
after the first (warm-up), the fit sets, relative to the shipped constants:

* ``gen_eff_scale`` / ``train_eff_scale`` / ``fwd_eff_scale``: predicted / measured time of
  the generation, training and forward-only units (the achieved share of the modelled rate);
* ``fitted_step_overhead_s``: measured step minus the step predicted with those scales and no
  step overhead (what the runtime spends outside the units), at least 0.

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
from rpeg.perf.calibration import SHIPPED, Calibration, _user_file
from rpeg.perf.units import FWD_KINDS, GEN_KIND, TRAIN_KINDS

SCALE_RANGE = (0.01, 100.0)


class RunDataError(ProblemsError):
    title = "run folder cannot be calibrated on"


@dataclass
class MeasuredRun:
    unit_s: dict[str, float]  # unit (stage) name -> median seconds per step
    step_s: float  # median measured step
    steps: int  # steps used


def read_run(run_dir: str | Path, skip: int = 1) -> MeasuredRun:
    """Median unit and step times of a run folder (first ``skip`` steps left out when the
    run has more)."""
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
    steps = sorted({int(h.get("step", i)) for i, h in enumerate(hist)})
    keep = set(steps[skip:]) if len(steps) > skip else set(steps)
    step_s = [
        float(h["step_s"])
        for i, h in enumerate(hist)
        if "step_s" in h and int(h.get("step", i)) in keep
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
    return MeasuredRun(
        unit_s={k: statistics.median(v.values()) for k, v in per.items()},
        step_s=statistics.median(step_s),
        steps=len(step_s),
    )


def predictor(graph: Any, plan: Any, workload: Any) -> Any:
    """``calib -> StepPrediction`` for a run's plan, on its cluster sized to the plan's devices
    (a run config names the cluster and how many of its devices it uses)."""
    from rpeg import specs
    from rpeg.perf.pricing import predict

    cl = specs.cluster(plan.cluster, num_devices=max(plan.num_devices, 1))
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
    predict_fn: Any, measured: MeasuredRun, base: Calibration = SHIPPED
) -> tuple[dict[str, float], list[str]]:
    """The fitted values and one line per fitted quantity. ``predict_fn(calib)`` predicts
    the measured run's plan with ``calib``."""
    pred = predict_fn(base)
    sums: dict[str, list[float]] = {}
    lines = []
    for name, st in pred.stages.items():
        cls = _class(st.kinds)
        if cls is None or name not in measured.unit_s:
            continue
        s = sums.setdefault(cls, [0.0, 0.0])
        s[0] += st.time_s
        s[1] += measured.unit_s[name]
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
    out: dict[str, float] = {}
    for cls, (p, m) in sums.items():
        if m > 0 and p > 0:
            out[f"{cls}_eff_scale"] = min(max(p / m, SCALE_RANGE[0]), SCALE_RANGE[1])
    scaled = replace(base, **out, fitted_step_overhead_s=0.0)
    rest = measured.step_s - predict_fn(scaled).step_s
    out["fitted_step_overhead_s"] = max(0.0, rest)
    lines.append(
        f"step: measured {measured.step_s:.4g} s over {measured.steps} steps; "
        f"outside the units {out['fitted_step_overhead_s']:.4g} s"
    )
    return out, lines


def write(cluster: str, values: dict[str, float], source: str, path: Path | None = None) -> Path:
    """Store ``values`` for ``cluster`` in the user's calibration.yaml (other clusters kept)."""
    import yaml

    path = path or _user_file()
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    data = data if isinstance(data, dict) else {}
    entry = {k: round(float(v), 6) for k, v in values.items()}
    entry["source"] = f"{source} ({time.strftime('%Y-%m-%d')})"
    data.setdefault("clusters", {})[cluster] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
