"""Pricing inside one cell (a structure and a placement): per-unit layouts priced and cached
once, Pareto fronts, lower bounds, assembly, annealing and exhaustive enumeration (pure)."""

from __future__ import annotations

import itertools
import math
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from rpeg.ir import Graph, to_dict
from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.perf.prediction import StepPrediction
from rpeg.perf.pricing import predict
from rpeg.plan.schema import GraphRef, InfeasiblePlan, Plan, UnitPlan
from rpeg.search.problem import PlanProblem
from rpeg.search.result import Candidate
from rpeg.search.space import (
    POOL_GEN_KINDS,
    Layout,
    Placement,
    SearchSpace,
    Structure,
    layout_class,
    unit_kinds,
)

_STATE_KEYS = ("weights", "gradients", "optimizer")


# --- evaluation -----------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitCost:
    time_s: float
    peak_gb: float
    moved_gb: float


@dataclass
class Cell:
    structure: Structure
    graph: Graph
    placement: Placement
    units: list[tuple[str, frozenset[str], tuple[tuple[str, str], ...]]]
    devices: dict[str, tuple[int, ...]] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)
    graph_ref: GraphRef | None = None

    @property
    def key(self) -> str:
        return f"{self.structure}|{self.placement}"


class Evaluator:
    """Prices plans with the performance model; caches per-unit costs across cells."""

    def __init__(
        self,
        prob: PlanProblem,
        space: SearchSpace,
        calib: Calibration = DEFAULT,
        max_candidates: int = 0,
    ):
        self.prob = prob
        self.space = space
        self.counts = space.counts
        self.calib = calib
        self.cap = prob.cluster.gpu.hbm_gb
        self.max_candidates = max_candidates
        self._unit_cache: dict[tuple, UnitCost | str] = {}
        self._unitplans: dict[tuple, UnitPlan] = {}
        #: (layout class, layout) -> kept: narrows every unit's candidates (the report's
        #: best pp / cp alternatives: rpeg.search.optimizer.dimension_alternatives)
        self.layout_filter: Callable[[str, Layout], bool] | None = None

    # --- cells ----------------------------------------------------------------------------
    def cell(self, st: Structure, g: Graph, pl: Placement) -> Cell:
        units = unit_kinds(g)
        c = Cell(st, g, pl, units)
        pools = pl.pools()
        for name, kinds, sig in units:
            if pl.colocated:
                c.devices[name] = pools["all"]
            else:
                c.devices[name] = pools["gen"] if kinds & POOL_GEN_KINDS else pools["train"]
            c.classes[name] = layout_class(kinds, sig)
        return c

    def candidates(self, c: Cell, name: str) -> list[Layout]:
        lays = self.space.layouts(c.classes[name], len(c.devices[name]))
        if self.layout_filter is None:
            return lays
        return [lay for lay in lays if self.layout_filter(c.classes[name], lay)]

    def offloaded(self, c: Cell, name: str) -> bool:
        pl = c.placement
        if not pl.offload:
            return False
        if pl.colocated:
            return True
        return c.devices[name][0] >= pl.gen_devices  # the training pool time-shares roles

    def unit_plan(self, c: Cell, name: str, lay: Layout) -> UnitPlan:
        devs = c.devices[name]
        off = self.offloaded(c, name)
        key = (devs[0], len(devs), lay, off)
        up = self._unitplans.get(key)
        if up is None:
            up = UnitPlan(
                devices=devs,
                tp=lay.tp,
                pp=lay.pp,
                cp=lay.cp,
                ep=lay.ep,
                micro_batch_size=lay.micro_batch_size,
                recompute=lay.recompute,
                offload=off,
                engine=lay.engine,
                gpu_memory_utilization=lay.gpu_memory_utilization,
            )
            self._unitplans[key] = up
        return up

    def plan(self, c: Cell, layouts: dict[str, Layout]) -> Plan:
        st, pl, p = c.structure, c.placement, self.prob
        if c.graph_ref is None:
            opts = {**p.builder_options, "staleness": st.staleness}
            inline = to_dict(c.graph) if (st.fused or st.share_actor_critic) else None
            c.graph_ref = GraphRef(builder=p.algorithm, options=opts, inline=inline)
        return Plan(
            cluster=p.cluster.name,
            num_nodes=p.cluster.num_nodes,
            model=p.model.name,
            graph=c.graph_ref,
            staleness=st.staleness,
            partial_rollout=pl.partial_rollout,
            streaming=pl.streaming,
            units={n: self.unit_plan(c, n, layouts[n]) for n, _, _ in c.units},
        )

    def price(
        self,
        c: Cell,
        layouts: dict[str, Layout],
        *,
        check_memory: bool = True,
        plan: Plan | None = None,
    ) -> StepPrediction | InfeasiblePlan:
        plan = plan or self.plan(c, layouts)
        self.counts.evaluated += 1
        try:
            return predict(
                c.graph,
                plan,
                self.prob.workload,
                cluster=self.prob.cluster,
                model=self.prob.model,
                calib=self.calib,
                check_memory=check_memory,
            )
        except InfeasiblePlan as exc:
            return exc

    def candidate(self, c: Cell, layouts: dict[str, Layout]) -> Candidate | None:
        plan = self.plan(c, layouts)
        r = self.price(c, layouts, plan=plan)
        if isinstance(r, InfeasiblePlan):
            self.counts.reject(r.reason)
            return None
        return Candidate(c.structure, c.placement, dict(layouts), plan, r)

    @property
    def exhausted(self) -> bool:
        return bool(self.max_candidates) and self.counts.evaluated >= self.max_candidates

    # --- per-unit costs -----------------------------------------------------------------
    def _ukey(self, c: Cell, name: str, sig: tuple, lay: Layout) -> tuple:
        devs = c.devices[name]
        gen = (
            (c.structure.staleness, c.placement.partial_rollout)
            if c.classes[name] == "gen"
            else None
        )
        # sharing changes what a unit reads (values, returns) and adds the value head
        # a runtime that reuses the sampling log-probs prices old_logprob by staleness
        k = c.structure.staleness if self.prob.cluster.reuses_rollout_logprobs else None
        return (sig, devs[0], len(devs), lay, gen, c.structure.share_actor_critic, k)

    def unit_costs(self, c: Cell) -> dict[str, list[tuple[Layout, UnitCost]]] | None:
        """Feasible (layout, cost) per unit, fastest first; None when no generation fits."""
        sigs = {n: s for n, _, s in c.units}
        cands = {n: self.candidates(c, n) for n, _, _ in c.units}
        if any(not v for v in cands.values()):
            self.counts.reject("devices")
            return None
        gens = [n for n, _, _ in c.units if c.classes[n] == "gen"]
        base = {n: cands[n][0] for n in cands}

        def record(lays: dict[str, Layout], pred: StepPrediction) -> None:
            for n in lays:
                sc = pred.stages[n]
                mem = sc.memory_gb
                self._unit_cache[self._ukey(c, n, sigs[n], lays[n])] = UnitCost(
                    sc.time_s, sc.peak_memory_gb, sum(mem.get(k, 0.0) for k in _STATE_KEYS)
                )

        def probe(lays: dict[str, Layout]) -> InfeasiblePlan | None:
            r = self.price(c, lays, check_memory=False)
            if isinstance(r, InfeasiblePlan):
                return r
            record(lays, r)
            return None

        # generation first: its layouts may not fit at all (weights over the KV budget)
        for gname in gens:
            for lay in cands[gname]:
                k = self._ukey(c, gname, sigs[gname], lay)
                if k in self._unit_cache:
                    continue
                trial = {**base, gname: lay}
                err = probe(trial)
                if err is not None:
                    if err.unit and err.unit != gname and err.reason != "memory":
                        raise err
                    self._unit_cache[k] = err.reason
            ok = [
                lay
                for lay in cands[gname]
                if isinstance(
                    self._unit_cache.get(self._ukey(c, gname, sigs[gname], lay)), UnitCost
                )
            ]
            if not ok:
                self.counts.reject("memory", len(cands[gname]))
                return None
            base[gname] = ok[0]
        # every other unit: batch the i-th missing layout of every unit into one probe
        need = {
            n: [lay for lay in cands[n] if self._ukey(c, n, sigs[n], lay) not in self._unit_cache]
            for n in cands
            if n not in gens
        }
        for i in range(max((len(v) for v in need.values()), default=0)):
            trial = {n: (need[n][i] if i < len(need.get(n, ())) else base[n]) for n in cands}
            err = probe(trial)
            if err is not None:  # cannot happen without a memory check; keep it loud
                raise err
        out: dict[str, list[tuple[Layout, UnitCost]]] = {}
        for n in cands:
            rows = []
            for lay in cands[n]:
                v = self._unit_cache.get(self._ukey(c, n, sigs[n], lay))
                if not isinstance(v, UnitCost):
                    continue
                if v.peak_gb > self.cap:
                    self.counts.reject("memory")
                    continue
                rows.append((lay, v))
            if not rows:
                return None
            rows.sort(key=lambda r: (r[1].time_s, r[1].peak_gb, r[1].moved_gb))
            out[n] = _pareto(rows)
        return out


def _pareto(rows: list[tuple[Layout, UnitCost]]) -> list[tuple[Layout, UnitCost]]:
    """Keep layouts not dominated in (time, peak memory, offloaded bytes); rows sorted by time."""
    kept: list[tuple[Layout, UnitCost]] = []
    for lay, uc in rows:
        if any(
            k.time_s <= uc.time_s and k.peak_gb <= uc.peak_gb and k.moved_gb <= uc.moved_gb
            for _, k in kept
        ):
            continue
        kept.append((lay, uc))
    return kept


# --- assembling one cell --------------------------------------------------------------------
def lower_bound(ev: Evaluator, c: Cell, costs: dict[str, list[tuple[Layout, UnitCost]]]) -> float:
    """A step time no plan of the cell can beat: the model runs units of one pool one after
    another and overlaps pools only with k >= 1 (or streams the trainer behind generation),
    and always adds the fixed per-step overhead."""
    # weight sync depends on both the generation and the training layout: bound it by 0
    coupled = {n for n, kinds, _ in c.units if "sync_weights" in kinds}
    fastest = {
        n: (0.0 if n in coupled else min(uc.time_s for _, uc in rows)) for n, rows in costs.items()
    }
    pl, k = c.placement, c.structure.staleness
    if pl.colocated or (k == 0 and not pl.streaming):
        body = sum(fastest.values())
    else:
        pools: dict[int, float] = {}
        for n, t in fastest.items():
            first = c.devices[n][0]
            pools[first] = pools.get(first, 0.0) + t
        body = pools.get(0, 0.0) if (k == 0 and pl.streaming) else max(pools.values())
    over = ev.prob.cluster.step_overhead_s
    return body + (ev.calib.step_overhead_s if over is None else over)


def solve_cell(
    ev: Evaluator,
    c: Cell,
    *,
    descent_rounds: int = 2,
    width: int = 6,
    costs: dict[str, list[tuple[Layout, UnitCost]]] | None = None,
    descend: bool = True,
) -> Candidate | None:
    """Best feasible plan of one cell by threshold assembly + coordinate descent."""
    costs = costs if costs is not None else ev.unit_costs(c)
    if costs is None:
        return None
    names = list(costs)
    peaks = sorted({uc.peak_gb for rows in costs.values() for _, uc in rows})
    if len(peaks) > 8:
        peaks = [peaks[round(i * (len(peaks) - 1) / 7)] for i in range(8)]
    seen: set[tuple] = set()
    best: Candidate | None = None
    for tau in reversed(peaks):
        lays = {}
        for n in names:
            fit = [lay for lay, uc in costs[n] if uc.peak_gb <= tau]
            lays[n] = fit[0] if fit else min(costs[n], key=lambda r: r[1].peak_gb)[0]
        key = tuple(lays[n] for n in names)
        if key in seen:
            continue
        seen.add(key)
        cand = ev.candidate(c, lays)
        if cand is not None and (best is None or cand.step_s < best.step_s):
            best = cand
        if cand is not None and tau == peaks[-1]:
            break  # the unconstrained per-unit optimum fits: lower thresholds only slow units down
    if best is None:
        # fall back to the lowest-memory layout of every unit
        lays = {n: min(costs[n], key=lambda r: (r[1].peak_gb, r[1].time_s))[0] for n in names}
        if tuple(lays[n] for n in names) not in seen:
            best = ev.candidate(c, lays)
        if best is None:
            return None
    for _ in range(descent_rounds if descend else 0):
        improved = False
        for n in names:
            if len(costs[n]) < 2:
                continue
            unit_s = {lay: uc.time_s for lay, uc in costs[n]}
            for lay, uc in _spread(costs[n], width):
                if lay == best.layouts[n] or ev.exhausted:
                    continue
                cand = ev.candidate(c, {**best.layouts, n: lay})
                if cand is None and uc.time_s < unit_s.get(best.layouts[n], math.inf):
                    # a faster layout that does not fit with the others as they are: units
                    # couple (a log-prob pass on the trainer's devices takes its layout), so
                    # try it with each other unit moved too
                    cand = _pair_move(ev, c, costs, best, n, lay, width)
                if cand is not None and cand.step_s < best.step_s - 1e-12:
                    best, improved = cand, True
        if not improved:
            break
    return best


def _pair_move(
    ev: Evaluator,
    c: Cell,
    costs: dict[str, list[tuple[Layout, UnitCost]]],
    best: Candidate,
    n: str,
    lay: Layout,
    width: int,
) -> Candidate | None:
    """The best feasible plan with unit ``n`` at ``lay`` and the others moved with it: every
    unit that has a layout of ``lay``'s shape (tp, pp, cp, ep) at its fastest such, or one other
    unit at one of its ``width`` fastest layouts (or its leanest); None when none fits. What a
    one-unit descent cannot reach: grpo llama3.1-70b on 16 GH200s sat at train tp 1 (4088 s)
    because train tp 2 needs the log-prob units on its devices at tp 2 too (1725-1769 s)."""
    shape = (lay.tp, lay.pp, lay.cp, lay.ep)
    aligned = {**best.layouts, n: lay}
    for m, rows in costs.items():
        same = [lm for lm, _ in rows if (lm.tp, lm.pp, lm.cp, lm.ep) == shape]
        if m != n and same:
            aligned[m] = same[0]  # rows run fastest first
    out = None if ev.exhausted else ev.candidate(c, aligned)
    for m in costs:
        if m == n or len(costs[m]) < 2:
            continue
        for lm, _ in _spread(costs[m], width):
            if lm == best.layouts[m] or ev.exhausted:
                continue
            cand = ev.candidate(c, {**best.layouts, n: lay, m: lm})
            if cand is not None and (out is None or cand.step_s < out.step_s):
                out = cand
    return out


def _spread(rows: list[tuple[Layout, UnitCost]], width: int) -> list[tuple[Layout, UnitCost]]:
    """The ``width`` fastest Pareto layouts plus the leanest one (memory relief)."""
    out = rows[:width]
    lean = min(rows, key=lambda r: (r[1].peak_gb, r[1].time_s))
    return out if lean in out else [*out, lean]


def anneal_cell(ev: Evaluator, c: Cell, start: Candidate, *, steps: int, seed: int) -> Candidate:
    """Seeded simulated annealing over the cell's per-unit Pareto layouts."""
    costs = ev.unit_costs(c)
    if costs is None or steps <= 0:
        return start
    names = [n for n in costs if len(costs[n]) > 1]
    if not names:
        return start
    rng = random.Random(zlib.crc32(f"{seed}|{c.key}".encode()))
    cur = best = start
    t0 = 0.05 * start.step_s
    for i in range(steps):
        if ev.exhausted:
            break
        n = names[rng.randrange(len(names))]
        lay = costs[n][rng.randrange(len(costs[n]))][0]
        if lay == cur.layouts[n]:
            continue
        cand = ev.candidate(c, {**cur.layouts, n: lay})
        if cand is None:
            continue
        temp = t0 * (1.0 - i / steps) + 1e-9
        if cand.step_s < cur.step_s or rng.random() < math.exp(-(cand.step_s - cur.step_s) / temp):
            cur = cand
            if cur.step_s < best.step_s:
                best = cur
    return best


def exhaustive_cell(ev: Evaluator, c: Cell) -> Candidate | None:
    """Price every combination of unit layouts of one cell (full predict each)."""
    names = [n for n, _, _ in c.units]
    cands = [ev.candidates(c, n) for n in names]
    best = None
    for combo in itertools.product(*cands):
        cand = ev.candidate(c, dict(zip(names, combo, strict=True)))
        if cand is not None and (best is None or cand.step_s < best.step_s):
            best = cand
    return best
