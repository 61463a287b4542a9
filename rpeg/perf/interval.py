"""A range for every prediction, from what is not known about it.

Each uncertain input moves the prediction one way or the other: the efficiencies of each
term (decode bandwidth, training/forward compute, collectives) within their documented
bounds, the fixed costs within a factor, and every input the run leaves blank (response
length, prompt length, KV budget, activation checkpointing, packing) over its prior's range;
a stand-in architecture (a model the catalog lacks) moves the step by :data:`ARCH_FACTOR`.
Each is moved alone to both ends and the prediction's deviations are combined in quadrature
(independent errors), so the range is ``point - sqrt(sum of downward deviations^2)`` to
``point + sqrt(sum of upward deviations^2)``. The bounds are in
:class:`rpeg.perf.calibration.Calibration` (``*_uncertainty``, ``fixed_cost_factor``,
``length_prior_spread``) and docs/validation.md, "Intervals".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from rpeg.perf.calibration import DEFAULT, Calibration, resolve
from rpeg.perf.pricing import predict
from rpeg.plan.schema import InfeasiblePlan

# Range of the blank inputs (published RL recipes): KV budget share, prompt length factor.
UTIL_RANGE = (0.6, 0.9)
PROMPT_FACTOR = 2.0
#: a stand-in architecture's factor either way (a model the catalog lacks, priced as the
#: nearest cataloged one at its size: rpeg.perf.validation.stand_in): each shipped
#: row priced with a stand-in from a catalog without its own shape is within 1.30x of its own
#: model's price on 80% of rows, 1.75x on 90% (docs/validation.md, "Models the catalog lacks")
ARCH_FACTOR = 1.5


@dataclass(frozen=True)
class Unknowns:
    """Which inputs of a prediction were not given (and took a prior)."""

    response_length: bool = False
    prompt_length: bool = False
    gpu_memory_utilization: bool = False
    recompute: bool = False
    seq_packing: bool = False
    spec_accept: bool = False  # speculative decoding's acceptance length (its prior)
    architecture: bool = False  # a stand-in architecture (a model the catalog lacks)

    @classmethod
    def of(cls, names: Any) -> Unknowns:
        s = set(names)
        return cls(
            response_length="avg_gen_len" in s or "max_gen_len" in s,
            prompt_length="avg_prompt_len" in s,
            gpu_memory_utilization="gpu_memory_utilization" in s,
            recompute="act_ckpt" in s,
            seq_packing="seq_packing" in s,
            spec_accept="spec_accept_len" in s,
            architecture="model" in s,
        )


def _scaled(cal: Calibration, names: tuple[str, ...], f: float, cap: float | None = None):
    kw = {}
    for n in names:
        v = getattr(cal, n) * f
        kw[n] = min(v, cap) if cap is not None else v
    return replace(cal, **kw)


def _variants(cal: Calibration, unknown: Unknowns) -> list[tuple[str, Calibration, dict]]:
    """(name, calibration, plan/workload edits) for each end of each uncertain input."""
    u_dec, u_cmp, u_com = cal.decode_uncertainty, cal.compute_uncertainty, cal.comm_uncertainty
    fx = cal.fixed_cost_factor
    dec = ("decode_hbm_eff", "moe_expert_hbm_eff", "kv_hbm_eff")
    cmp_ = ("train_eff_factor", "forward_eff_factor", "attn_eff", "fp8_gemm_eff")
    fixed = (
        "decode_step_overhead_s",
        "layer_overhead_s",
        "moe_layer_overhead_s",
        "step_overhead_s",
        "host_per_sample_s",
    )
    out: list[tuple[str, Calibration, dict]] = []
    for sign in (+1, -1):
        out.append(("decode", _scaled(cal, dec, 1 + sign * u_dec, 0.95), {}))
        out.append(("compute", _scaled(cal, cmp_, 1 + sign * u_cmp, 0.95), {}))
        out.append(("comm", _scaled(cal, ("nccl_bus_eff",), 1 + sign * u_com, 0.95), {}))
        out.append(("fixed", _scaled(cal, fixed, fx**sign), {}))
        out.append(("refit", _scaled(cal, ("refit_s_per_gb",), fx**sign), {}))
        if unknown.response_length:
            s = cal.length_prior_spread**sign
            out.append(
                (
                    "response_length",
                    _scaled(cal, ("response_median_reasoning", "response_median_instruct"), s),
                    {},
                )
            )
        if unknown.prompt_length:
            out.append(("prompt_length", cal, {"prompt": PROMPT_FACTOR**sign}))
        if unknown.gpu_memory_utilization:
            out.append(("kv_budget", cal, {"util": UTIL_RANGE[0 if sign > 0 else 1]}))
        if unknown.spec_accept:
            # the acceptance rate from half the prior's rejections to twice them
            rej = (1.0 - cal.spec_accept_rate) * 2.0**-sign
            out.append(("spec_accept", replace(cal, spec_accept_rate=max(0.0, 1.0 - rej)), {}))
    if unknown.recompute:
        out.append(("recompute", cal, {"recompute": "flip"}))
    if unknown.seq_packing:
        out.append(("seq_packing", cal, {"seq_packing": "flip"}))
    return out


def _edit(plan: Any, wl: Any, edits: dict) -> tuple[Any, Any]:
    if not edits:
        return plan, wl
    units = {}
    for name, u in plan.units.items():
        upd: dict[str, Any] = {}
        if "util" in edits and u.engine == "vllm":
            upd["gpu_memory_utilization"] = edits["util"]
        if "recompute" in edits and u.engine != "vllm":
            upd["recompute"] = not u.recompute
        if "seq_packing" in edits and u.engine != "vllm":
            upd["seq_packing"] = not u.packs()
        units[name] = u.model_copy(update=upd) if upd else u
    plan = plan.model_copy(update={"units": units})
    if "prompt" in edits:
        wl = replace(wl, mean_prompt_tokens=wl.mean_prompt_tokens * edits["prompt"])
    return plan, wl


def predict_interval(
    graph: Any,
    plan: Any,
    workload: Any,
    calib: Calibration = DEFAULT,
    unknown: Unknowns = Unknowns(),
    *,
    point: float | None = None,
) -> tuple[float, float]:
    """(low, high) step time of ``plan`` from its uncertain inputs (see module doc)."""
    calib = resolve(calib, plan.cluster)  # this machine's fitted values, if any
    if point is None:
        point = predict(graph, plan, workload, calib=calib).step_s
    down = up = 0.0
    by_input: dict[str, list[float]] = {}
    for name, cal, edits in _variants(calib, unknown):
        p, w = _edit(plan, workload, edits)
        try:
            s = predict(graph, p, w, calib=cal).step_s
        except (InfeasiblePlan, ValueError):
            continue  # that end does not fit: it bounds nothing
        by_input.setdefault(name, []).append(s - point)
    if unknown.architecture:
        by_input["architecture"] = [point * (ARCH_FACTOR - 1.0), point * (1.0 / ARCH_FACTOR - 1.0)]
    for devs in by_input.values():
        down += max([0.0] + [-d for d in devs]) ** 2
        up += max([0.0] + devs) ** 2
    return max(0.0, point - math.sqrt(down)), point + math.sqrt(up)
