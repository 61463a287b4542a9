"""The optimizer: search structure, placement and layouts under the performance model (pure).

Algorithm (docs/optimizer.md has the full account):

1. Enumerate structures (k, sharing, fusion) and, per structure, placements (colocated, or a
   node-aligned generation/training split; offload, partial rollout, streaming switches).
2. A *cell* is one (structure, placement). Inside a cell the model is (almost) separable by
   execution unit: a unit's cost depends only on its own layout and devices. So every unit's
   layouts are priced independently (batched into a few ``predict`` calls, cached across
   cells) and a unit layout that alone overflows a device is dropped first (memory).
3. The cell's plan is assembled from the per-unit Pareto fronts (time, memory, offloaded
   bytes) by memory-threshold enumeration, then improved by coordinate descent; the top
   cells get a short seeded simulated annealing. Every assembled plan is priced by the full
   ``predict``; infeasible ones are counted by reason and never returned.
4. Device splits: all of them when there are few nodes, else coarse-to-fine (eighths of the
   cluster, then halving the step around the best split down to one node).

``mode="exhaustive"`` prices the full product instead (small spaces; tests check that the
decomposed search finds the same optimum there).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from rpeg.ir import Graph
from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.plan.schema import InfeasiblePlan
from rpeg.search.baselines import price_baselines
from rpeg.search.evaluate import Evaluator, anneal_cell, exhaustive_cell, lower_bound, solve_cell
from rpeg.search.inputs import config_from_kwargs, load_config
from rpeg.search.problem import PlanProblem, default_space, problem_from_config, search_space
from rpeg.search.result import Candidate, DimensionAlternative, SearchResult
from rpeg.search.space import (
    POOL_GEN_KINDS,
    Counts,
    Placement,
    SearchSpace,
    SpaceOptions,
    Structure,
    layout_class,
    unit_kinds,
)


# --- the search -----------------------------------------------------------------------------
@dataclass
class SearchOptions:
    mode: str = "auto"  # auto | exhaustive | decompose
    seed: int = 0
    max_candidates: int = 0  # full-plan evaluations; 0 = no cap
    time_budget_s: float = 0.0  # 0 = no budget
    exhaustive_limit: int = 3000  # auto: exhaustive when the full product is at most this
    anneal_top: int = 3
    anneal_steps: int = 40
    top_alternatives: int = 5


def space_size(space: SearchSpace, ev: Evaluator) -> int:
    """Number of full plans in the product space (every split, every unit layout). Counted
    from each unit's layout class and pool size (what ``Evaluator.candidates`` depends on),
    without building the cells: a 100k-device cluster has 12.5k node-aligned splits."""
    total = 0
    for st, g in space.structures():
        units = [
            (layout_class(kinds, sig), bool(kinds & POOL_GEN_KINDS))
            for _, kinds, sig in unit_kinds(g)
        ]
        for pl in space.placements(st):
            prod = 1
            for cls, gen in units:
                n = (
                    pl.num_devices
                    if pl.colocated
                    else (pl.gen_devices if gen else pl.train_devices)
                )
                prod *= max(1, len(space.layouts(cls, n)))
            total += prod
    return total


def search(
    prob: PlanProblem,
    *,
    space_options: SpaceOptions | None = None,
    options: SearchOptions | None = None,
    calib: Calibration = DEFAULT,
    cell_filter: Any = None,
    pruned: dict[tuple, float] | None = None,
) -> tuple[list[Candidate], Counts, str]:
    """All cells' best candidates (sorted by step time), the counts and the mode used.

    ``pruned`` (filled when given): family -> lowest lower bound among cells cut by the bound.
    """
    pruned = {} if pruned is None else pruned
    opt = options or SearchOptions()
    space = search_space(prob, space_options)
    ev = Evaluator(prob, space, calib, opt.max_candidates)
    mode = opt.mode
    if mode == "auto":
        mode = "exhaustive" if space_size(space, ev) <= opt.exhaustive_limit else "decompose"
        space.counts = ev.counts = Counts()
        space._layouts.clear()
    t0 = time.perf_counter()
    results: list[Candidate] = []
    structures = space.structures()
    if mode == "exhaustive":
        for st, g in structures:
            if cell_filter is not None and not cell_filter(st, None):
                continue
            for pl in space.placements(st):
                if cell_filter is not None and not cell_filter(st, pl):
                    continue
                space.counts.placements += 1
                best = exhaustive_cell(ev, ev.cell(st, g, pl))
                if best is not None:
                    results.append(best)
    else:
        results = _decompose(ev, space, structures, opt, t0, cell_filter, pruned)
    results.sort(key=lambda c: c.step_s)
    if mode != "exhaustive":
        # refine: coordinate descent for the top cells of every incumbent group, then a short
        # seeded annealing for the overall top cells
        for gr in ("all", "sync", "colocated", "plain"):
            members = [i for i, c in enumerate(results) if gr in _groups(c.structure, c.placement)]
            for i in members[:3]:
                cand = results[i]
                if not cand.refined:
                    c = ev.cell(
                        cand.structure, ev_graph(structures, cand.structure), cand.placement
                    )
                    results[i] = solve_cell(ev, c) or cand
                    results[i].refined = True
        results.sort(key=lambda c: c.step_s)
        for i, cand in enumerate(results[: opt.anneal_top]):
            c = ev.cell(cand.structure, ev_graph(structures, cand.structure), cand.placement)
            results[i] = anneal_cell(ev, c, cand, steps=opt.anneal_steps, seed=opt.seed)
        results.sort(key=lambda c: c.step_s)
    return results, space.counts, mode


def ev_graph(structures: list[tuple[Structure, Graph]], st: Structure) -> Graph:
    for s, g in structures:
        if s == st:
            return g
    raise KeyError(st)


def _groups(st: Structure, pl: Placement) -> tuple[str, ...]:
    """Incumbent groups a cell competes in: overall and each single-constraint baseline."""
    g = ["all"]
    if st.staleness == 0:
        g.append("sync")
    if pl.colocated:
        g.append("colocated")
    if not st.share_actor_critic and st.fusion == "none":
        g.append("plain")
    return tuple(g)


def _decompose(
    ev: Evaluator,
    space: SearchSpace,
    structures: list[tuple[Structure, Graph]],
    opt: SearchOptions,
    t0: float,
    cell_filter: Any,
    pruned: dict[tuple, float],
) -> list[Candidate]:
    out: list[Candidate] = []
    inc: dict[str, float] = {}

    def over() -> bool:
        return ev.exhausted or (
            opt.time_budget_s > 0 and time.perf_counter() - t0 > opt.time_budget_s
        )

    def run(st: Structure, g: Graph, pl: Placement) -> float:
        """Solve one cell; the step time, its lower bound when pruned, inf when infeasible."""
        if cell_filter is not None and not cell_filter(st, pl):
            return math.inf
        space.counts.placements += 1
        c = ev.cell(st, g, pl)
        costs = ev.unit_costs(c)
        if costs is None:
            return math.inf
        groups = _groups(st, pl)
        lb = lower_bound(ev, c, costs)
        if all(lb >= inc.get(gr, math.inf) * (1 - 1e-9) for gr in groups):
            space.counts.pruned += 1
            fam = _family_key(st, pl)
            pruned[fam] = min(pruned.get(fam, math.inf), lb)
            return lb
        best = solve_cell(ev, c, costs=costs, descent_rounds=1, width=4)
        if best is None:
            return math.inf
        if best.step_s < 1.15 * min(inc.get(gr, math.inf) for gr in groups):
            best = solve_cell(ev, c, costs=costs) or best
            best.refined = True
        out.append(best)
        for gr in groups:
            inc[gr] = min(inc.get(gr, math.inf), best.step_s)
        return best.step_s

    n = space.num_devices
    for st, g in structures:
        if cell_filter is not None and not cell_filter(st, None):
            continue
        for pl in space.placements(st, splits=[]):
            if over():
                return out
            run(st, g, pl)
    splits = space.splits()
    if not splits or not space.opt.disaggregated:
        return out
    for st, g in structures:
        if cell_filter is not None and not cell_filter(st, None):
            continue
        variants = sorted(
            {
                (p.offload, p.partial_rollout, p.streaming)
                for p in space.placements(st, splits=[splits[0]])
                if not p.colocated
            }
        )
        for off, pr, sm in variants:

            def at(gd: int, st=st, g=g, off=off, pr=pr, sm=sm) -> float:
                if over():
                    return math.inf
                return run(st, g, Placement(n, gd, offload=off, partial_rollout=pr, streaming=sm))

            if len(splits) <= space.opt.exhaustive_splits:
                for gd in splits:
                    at(gd)
                continue
            _coarse_to_fine(splits, n, at)
    return out


def _coarse_to_fine(splits: list[int], n: int, at: Any) -> None:
    """Eighths of the cluster (node-aligned), then halve the step around the best split."""
    unit = splits[0]
    seen: dict[int, float] = {}
    coarse = sorted(
        {max(unit, min(splits[-1], round(n * i / 8 / unit) * unit)) for i in range(1, 8)}
    )
    for gd in coarse:
        seen[gd] = at(gd)
    step = max(unit, ((coarse[1] - coarse[0]) // 2 // unit) * unit if len(coarse) > 1 else unit)
    while True:
        bestg = min(seen, key=seen.get)
        for gd in (bestg - step, bestg + step):
            if unit <= gd <= splits[-1] and gd not in seen:
                seen[gd] = at(gd)
        if min(seen, key=seen.get) != bestg:
            continue  # moved: search around the new best at the same step
        if step <= unit:
            break
        step = max(unit, (step // 2 // unit) * unit)


def solve(
    prob: PlanProblem,
    structure: Structure,
    placement: Placement,
    *,
    space_options: SpaceOptions | None = None,
    calib: Calibration = DEFAULT,
) -> Candidate | None:
    """Best plan of one given (structure, placement) cell, or None when nothing fits."""
    so = space_options or default_space(prob)
    so = so.restrict(max_staleness=max(so.max_staleness, structure.staleness))
    space = search_space(prob, so)
    ev = Evaluator(prob, space, calib)
    return solve_cell(ev, ev.cell(structure, structure.graph(prob.base), placement))


# --- the public entry -----------------------------------------------------------------------
def optimize(config: Any = None, /, **kwargs: Any) -> SearchResult:
    """Best plan for a run config (a RunConfig, a dict, a YAML path) or keyword arguments.

    Keywords: ``model``, ``gpu`` or ``cluster``, ``gpus`` (devices), ``algo``,
    ``num_prompts``, ``samples_per_prompt``, ``max_response_tokens``, ``max_staleness``,
    ``seed``, ``mode``, ``max_candidates``, ``time_budget_s``; ``space`` (SpaceOptions) and
    ``calib`` (Calibration).
    """
    space_opts = kwargs.pop("space", None)
    calib = kwargs.pop("calib", DEFAULT)
    search_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in SearchOptions.__dataclass_fields__}
    cfg = load_config(config) if config is not None else None
    cfg = config_from_kwargs(kwargs, base=cfg)
    prob = problem_from_config(cfg)
    s = getattr(cfg, "search", None)
    opt = SearchOptions(
        seed=search_kw.get("seed", getattr(s, "seed", 0)),
        mode=search_kw.get("mode", getattr(s, "mode", "auto")),
        max_candidates=search_kw.get("max_candidates", getattr(s, "max_candidates", 0)),
        time_budget_s=search_kw.get("time_budget_s", getattr(s, "time_budget_s", 0.0)),
        **{
            k: v
            for k, v in search_kw.items()
            if k not in ("seed", "mode", "max_candidates", "time_budget_s")
        },
    )
    return optimize_problem(prob, options=opt, space_options=space_opts, calib=calib)


def optimize_problem(
    prob: PlanProblem,
    *,
    options: SearchOptions | None = None,
    space_options: SpaceOptions | None = None,
    calib: Calibration = DEFAULT,
    baselines: bool = True,
) -> SearchResult:
    opt = options or SearchOptions()
    t0 = time.perf_counter()
    pruned: dict[tuple, float] = {}
    results, counts, mode = search(
        prob, space_options=space_options, options=opt, calib=calib, pruned=pruned
    )
    if not results:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(counts.infeasible.items())) or "none"
        raise InfeasiblePlan(
            "memory" if counts.infeasible.get("memory") else "devices",
            f"no feasible plan for {prob.describe()} (rejected candidates by reason: {reasons})",
        )
    best = results[0]
    bl = (
        price_baselines(prob, results, space_options=space_options, calib=calib)
        if baselines
        else {}
    )
    dims = dimension_alternatives(prob, best, space_options=space_options, calib=calib)
    faster = [
        d.candidate for d in dims.values() if d.candidate and d.candidate.step_s < best.step_s
    ]
    if faster:  # the cell's solve with the training units held at pp/cp > 1 found a better plan
        best = min(faster, key=lambda c: c.step_s)
        results = sorted([best, *results], key=lambda c: c.step_s)
        dims = dimension_alternatives(prob, best, space_options=space_options, calib=calib)
    alts = _alternatives(results, best, opt.top_alternatives, pruned)
    res = SearchResult(prob, best, alts, bl, counts, time.perf_counter() - t0, mode, opt.seed)
    res.step_range = _step_range(prob, best, calib)
    res.dimensions = dims
    return res


#: the parallel dimensions whose best plan the report shows beside the chosen one
DIMENSIONS = ("pp", "cp")


def dimension_alternatives(
    prob: PlanProblem,
    best: Candidate,
    *,
    space_options: SpaceOptions | None = None,
    calib: Calibration = DEFAULT,
) -> dict[str, DimensionAlternative]:
    """For pp and cp: the best plan of the chosen structure and placement whose training
    units run at that degree > 1 (the other units' layouts free), priced as the search
    prices; or, where none is feasible, why -- the training layouts at that degree rejected
    by reason (the space's rules, the runtime's refusals, memory). A user sees what the
    dimension would cost against the chosen plan, or what rules it out."""
    so = space_options or default_space(prob)
    st, pl = best.structure, best.placement
    graph = st.graph(prob.base)
    out: dict[str, DimensionAlternative] = {}
    for dim in DIMENSIONS:
        train_lays = [
            lay for n, lay in best.layouts.items() if n in best.plan.units and _is_train(best, n)
        ]
        if any(getattr(lay, dim) > 1 for lay in train_lays):
            out[dim] = DimensionAlternative(dim, best, chosen=True)
            continue
        degrees = tuple(d for d in getattr(so, dim) if d > 1)
        if not degrees:
            out[dim] = DimensionAlternative(
                dim, None, f"not searched ({dim} in {getattr(so, dim)})"
            )
            continue
        # every training layout at dim > 1 on the cell's training devices, rejected by reason
        rspace = search_space(prob, so.restrict(**{dim: degrees}))
        ev = Evaluator(prob, search_space(prob, so), calib)
        cell = ev.cell(st, graph, pl)
        sizes = {len(cell.devices[n]) for n, cls in cell.classes.items() if cls == "train"}
        kept = sum(len(rspace.layouts("train", k)) for k in sizes)
        rejected = dict(rspace.counts.infeasible)
        if not kept:
            out[dim] = DimensionAlternative(
                dim, None, _why_none(dim, prob, so, rejected), rejected=rejected
            )
            continue
        ev.layout_filter = lambda cls, lay, dim=dim: cls != "train" or getattr(lay, dim) > 1
        for n in cell.classes:  # enumerate first: the counts below are the pricing's own
            ev.candidates(cell, n)
        enumerated = dict(ev.counts.infeasible)
        cand = solve_cell(ev, cell)
        for k, v in ev.counts.infeasible.items():
            if v > enumerated.get(k, 0):
                rejected[k] = rejected.get(k, 0) + v - enumerated.get(k, 0)
        if cand is None:
            out[dim] = DimensionAlternative(
                dim, None, _why_none(dim, prob, so, rejected), rejected=rejected
            )
        else:
            out[dim] = DimensionAlternative(dim, cand, rejected=rejected)
    return out


def _is_train(c: Candidate, name: str) -> bool:
    s = c.prediction.stages.get(name)
    return s is not None and bool({"train_actor", "train_critic"} & set(s.kinds))


def _why_none(dim: str, prob: PlanProblem, so: SpaceOptions, rejected: dict[str, int]) -> str:
    if dim == "cp" and prob.max_seq_tokens < so.cp_min_seq_tokens:
        return (
            f"sequences of {prob.max_seq_tokens} tokens are below cp_min_seq_tokens "
            f"({so.cp_min_seq_tokens}): cp is not searched"
        )
    if not rejected:
        return f"no training layout at {dim} > 1"
    top = sorted(rejected.items(), key=lambda kv: -kv[1])
    return "every training layout rejected: " + ", ".join(f"{k} {v}" for k, v in top)


def _step_range(prob: PlanProblem, best: Candidate, calib: Calibration) -> tuple[float, float]:
    """The best plan's range (rpeg.perf.interval; the length prior widens it when the
    workload states no mean response length)."""
    from rpeg.perf.interval import Unknowns, predict_interval

    wl = prob.workload
    return predict_interval(
        best.structure.graph(prob.base),
        best.plan,
        wl,
        calib,
        Unknowns(response_length=wl.mean_response_tokens is None),
        point=best.step_s,
    )


def _alternatives(
    results: list[Candidate], best: Candidate, k: int, pruned: dict[tuple, float] | None = None
) -> list[Candidate]:
    """The best plan of each other (structure, placement kind, offload) family.

    A family with a cell cut by the bound below its best priced plan is skipped: its true
    best is unknown (between the bound and that plan), only known not to beat the winner."""
    pruned = pruned or {}
    seen = {_family(best)}
    out = []
    for c in results[1:]:
        f = _family(c)
        if f in seen or pruned.get(f, math.inf) < c.step_s:
            seen.add(f)
            continue
        seen.add(f)
        out.append(c)
        if len(out) >= k:
            break
    return out


def _family(c: Candidate) -> tuple:
    return _family_key(c.structure, c.placement)


def _family_key(st: Structure, pl: Placement) -> tuple:
    return (st, pl.colocated, pl.offload)
