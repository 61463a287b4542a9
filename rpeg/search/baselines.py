"""Baselines the field uses, priced by the same performance model as the optimizer (pure).

- ``verl``: hybrid engine. Every role colocated on all devices with offload, synchronous
  (k=0), no sharing or fusion, **one** layout for every role (FSDP training, the rollout at
  the same tensor-parallel degree). The best such layout is taken (a tuned verl).
- ``real``: ReaL-style. Synchronous, colocated, **per-stage** layouts with parameter
  reallocation between them (each unit gets its own best layout; offload on or off).
- ``areal``: AReaL-style. 3/4 of the devices (rounded to nodes) generate, the rest train,
  asynchronous with staleness max(1, the user's bound) and partial rollout; layouts per pool.
- ``best_sync``, ``best_colocated``, ``no_share_no_fusion``: the optimizer's best plan under
  one constraint each (k=0; one colocated pool; no actor-critic sharing and no fusion), so
  the report shows what each structural choice contributes.
"""

from __future__ import annotations

from typing import Any

from rpeg import defaults
from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.search.evaluate import Evaluator, solve_cell
from rpeg.search.problem import search_space
from rpeg.search.result import Baseline
from rpeg.search.space import Layout, Placement, SpaceOptions, Structure

DESCRIPTIONS = {
    "verl": "verl-style: colocated hybrid engine, synchronous, one layout for all roles",
    "real": "ReaL-style: colocated, synchronous, per-stage layouts with reallocation",
    "areal": "AReaL-style: 3/4 of devices generate, asynchronous, partial rollout",
    "best_sync": "best synchronous plan (k=0)",
    "best_colocated": "best colocated plan (one pool, time-shared)",
    "no_share_no_fusion": "best plan without actor-critic sharing or fusion",
}


def _new_evaluator(prob: Any, space_options: SpaceOptions | None, calib: Calibration):
    space = search_space(prob, space_options)
    return space, Evaluator(prob, space, calib)


def verl(prob: Any, space_options: SpaceOptions | None = None, calib: Calibration = DEFAULT):
    space, ev = _new_evaluator(prob, space_options, calib)
    st = Structure(0, False, "none")
    g = st.graph(prob.base)
    c = ev.cell(st, g, Placement(prob.num_devices, 0, offload=True))
    best = None
    tps = [
        tp
        for tp in space.opt.tp
        if prob.cluster.domain_size % tp == 0 and prob.model.heads % tp == 0
    ]
    for tp in tps:
        if prob.num_devices % tp:
            continue
        for mb in space.opt.micro_batch_sizes:
            lays = {}
            for name, cls in c.classes.items():
                if cls == "gen":
                    lays[name] = Layout(
                        tp=tp, gpu_memory_utilization=defaults.SEARCH_GPU_MEMORY_UTILIZATION
                    )
                elif cls == "none":
                    lays[name] = Layout()
                else:
                    lays[name] = Layout(tp=tp, micro_batch_size=mb, recompute=True, engine="fsdp")
            cand = ev.candidate(c, lays)
            if cand is not None and (best is None or cand.step_s < best.step_s):
                best = cand
    return Baseline("verl", DESCRIPTIONS["verl"], best, "" if best else _why(ev))


def real(prob: Any, space_options: SpaceOptions | None = None, calib: Calibration = DEFAULT):
    space, ev = _new_evaluator(prob, space_options, calib)
    st = Structure(0, False, "none")
    g = st.graph(prob.base)
    best = None
    for off in (True, False):
        cand = solve_cell(ev, ev.cell(st, g, Placement(prob.num_devices, 0, offload=off)))
        if cand is not None and (best is None or cand.step_s < best.step_s):
            best = cand
    return Baseline("real", DESCRIPTIONS["real"], best, "" if best else _why(ev))


def areal(prob: Any, space_options: SpaceOptions | None = None, calib: Calibration = DEFAULT):
    space, ev = _new_evaluator(prob, space_options, calib)
    n = prob.num_devices
    splits = space.splits()
    if not splits:
        return Baseline("areal", DESCRIPTIONS["areal"], None, "needs at least 2 devices")
    gen = min(splits, key=lambda s: (abs(s - 0.75 * n), -s))
    st = Structure(max(1, prob.max_staleness), False, "none")
    g = st.graph(prob.base)
    best = None
    for off in (False, True):
        cand = solve_cell(ev, ev.cell(st, g, Placement(n, gen, offload=off, partial_rollout=True)))
        if cand is not None and (best is None or cand.step_s < best.step_s):
            best = cand
    return Baseline("areal", DESCRIPTIONS["areal"], best, "" if best else _why(ev))


def _why(ev: Any) -> str:
    inf = ev.counts.infeasible
    if not inf:
        return "no candidate"
    return "infeasible: " + ", ".join(f"{k} x{v}" for k, v in sorted(inf.items()))


def constrained(results: list, name: str, pred) -> Any:
    for c in results:  # sorted by step time
        if pred(c):
            return Baseline(name, DESCRIPTIONS[name], c)
    return Baseline(name, DESCRIPTIONS[name], None, "no feasible plan under this constraint")


def price_baselines(
    prob: Any,
    results: list,
    *,
    space_options: SpaceOptions | None = None,
    calib: Calibration = DEFAULT,
) -> dict[str, Any]:
    """Every baseline, priced; infeasible ones carry the reason instead of a plan."""
    out = {
        "verl": verl(prob, space_options, calib),
        "real": real(prob, space_options, calib),
        "areal": areal(prob, space_options, calib),
        "best_sync": constrained(results, "best_sync", lambda c: c.structure.staleness == 0),
        "best_colocated": constrained(results, "best_colocated", lambda c: c.placement.colocated),
        "no_share_no_fusion": constrained(
            results,
            "no_share_no_fusion",
            lambda c: not c.structure.share_actor_critic and c.structure.fusion == "none",
        ),
    }
    return out
