"""The analytical performance model (pure): compute, memory, communication, timeline.

``predict(graph, plan, workload)`` returns a :class:`StepPrediction` (per-stage time,
FLOPs, bytes, comm by link level, memory per device; step latency, tokens/s/GPU, MFU and a
timeline of :class:`TimelineRecord`). ``predict_plan(plan, workload)`` builds the graph the
plan names first. ``price_unit(graph, plan, unit, workload)`` prices one execution unit on
its own (equal to ``predict(...).stages[unit]``, without the step assembly or memory check). Infeasible plans raise :class:`rpeg.plan.InfeasiblePlan`.

The model's constants and their refit from a measured run are :mod:`rpeg.perf.calibration`;
its check against published runs (``rpeg validate``) is :mod:`rpeg.perf.validation`, not the model.
"""

from __future__ import annotations

from typing import Any

from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.perf.prediction import StageCost, StepPrediction, Workload
from rpeg.perf.pricing import predict, price_unit
from rpeg.perf.timeline import TimelineRecord

__all__ = [
    "DEFAULT",
    "Calibration",
    "StageCost",
    "StepPrediction",
    "TimelineRecord",
    "Workload",
    "build_graph",
    "predict",
    "predict_plan",
    "price_unit",
]

_PERF_ONLY_OPTIONS = ("reuse_rollout_logprobs",)


def build_graph(plan: Any, algorithm: Any = None) -> Any:
    """The IR graph a plan names (inline IR or builder + options)."""
    from rpeg import ir

    if plan.graph.inline is not None:
        from rpeg.ir import serialize

        return serialize.from_dict(plan.graph.inline)
    opts = {k: v for k, v in plan.graph.options.items() if k not in _PERF_ONLY_OPTIONS}
    name = plan.graph.builder or (algorithm.name if algorithm is not None else "grpo")
    if algorithm is not None and "use_reference" not in opts:
        opts["use_reference"] = algorithm.use_reference
    opts.setdefault("staleness", plan.staleness)
    return ir.builders.build(name, **opts)


def predict_plan(
    plan: Any,
    workload: Any,
    *,
    algorithm: Any = None,
    calib: Calibration = DEFAULT,
    model: Any = None,
) -> StepPrediction:
    """``model``: the ModelSpec to price (default the plan's catalog name)."""
    return predict(build_graph(plan, algorithm), plan, workload, calib=calib, model=model)
