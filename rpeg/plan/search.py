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

import itertools
import math
import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import ConfigError, Problem
from rpeg.ir import Graph, build
from rpeg.perf.calib import DEFAULT, Calibration
from rpeg.perf.model import StepPrediction, Workload, predict
from rpeg.plan.plan import GraphRef, InfeasiblePlan, Plan, UnitPlan
from rpeg.plan.space import (
    POOL_GEN_KINDS,
    Counts,
    Layout,
    Placement,
    SearchSpace,
    SpaceOptions,
    Structure,
    layout_class,
    unit_kinds,
)

_STATE_KEYS = ("weights", "gradients", "optimizer")


# --- the problem ----------------------------------------------------------------------------
@dataclass
class PlanProblem:
    """Everything fixed by the user: graph family, model, cluster, workload, staleness bound."""

    algorithm: str
    builder_options: dict[str, Any]
    base: Graph
    model: Any
    cluster: Any
    workload: Workload
    num_devices: int
    max_staleness: int

    @property
    def max_seq_tokens(self) -> int:
        w = self.workload
        return int(
            w.max_seq_tokens
            or (w.max_prompt_tokens or w.mean_prompt_tokens) + w.max_response_tokens
        )

    def describe(self) -> str:
        w = self.workload
        return (
            f"{self.algorithm.upper()} on {self.model.name}, {self.num_devices} x {self.cluster.gpu.name} "
            f"({self.cluster.name}, {self.cluster.num_nodes} nodes), {w.num_prompts} prompts x "
            f"{w.samples_per_prompt} samples, max {w.max_response_tokens} response tokens, k <= {self.max_staleness}"
        )


def default_space(prob: PlanProblem) -> SpaceOptions:
    """The space for a problem: on the CPU profile only what the CPU runtime executes
    (data parallelism: tp = pp = cp = 1)."""
    so = SpaceOptions(max_staleness=prob.max_staleness)
    if prob.cluster.gpu.name == "cpu":
        so = so.restrict(tp=(1,), pp=(1,), cp=(1,), gen_pp=(1,), engines=("auto",))
    return so


def resolve_model(name: str) -> Any:
    """Catalog model by name; ``qwen2.5-32b`` also finds ``qwen2.5-32b-instruct``."""
    from rpeg import specs

    table = specs.models()
    if name in table:
        return table[name]
    for alt in (f"{name}-instruct", name.lower(), f"{name.lower()}-instruct"):
        if alt in table:
            return table[alt]
    return specs.model(name)  # raises SpecError listing the known models


def problem_from_config(config: Any) -> PlanProblem:
    """Build the :class:`PlanProblem` of a :class:`rpeg.config.RunConfig`."""
    from rpeg import specs

    model = resolve_model(config.model.name)
    cl = specs.cluster(config.cluster.name, num_devices=config.cluster.num_devices)
    n = config.cluster.num_devices or cl.num_devices
    algo = config.algorithm.name
    opts: dict[str, Any] = {"use_reference": config.algorithm.use_reference}
    if algo != "ppo":
        opts["group_size"] = config.workload.samples_per_prompt
    base = build(algo, **opts)
    return PlanProblem(
        algorithm=algo,
        builder_options=opts,
        base=base,
        model=model,
        cluster=cl,
        workload=Workload.from_config(config.workload),
        num_devices=n,
        max_staleness=config.runtime.max_staleness,
    )


# --- results --------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One priced, feasible plan and the choices that made it."""

    structure: Structure
    placement: Placement
    layouts: dict[str, Layout]
    plan: Plan
    prediction: StepPrediction
    label: str = ""
    refined: bool = False

    @property
    def step_s(self) -> float:
        return self.prediction.step_s

    def describe(self) -> str:
        return f"{self.structure.describe()}; {self.placement.describe()}"

    def summary(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "predicted_step_s": p.step_s,
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "mfu": p.mfu,
            "num_devices": p.num_devices,
            "structure": self.structure.describe(),
            "placement": self.placement.describe(),
            "layouts": {u: lay.describe() for u, lay in self.layouts.items()},
            "device_memory_gb": dict(p.device_memory_gb),
        }


@dataclass
class Baseline:
    name: str
    description: str
    candidate: Candidate | None
    reason: str = ""

    def to_dict(self, best_step_s: float | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"description": self.description}
        if self.candidate is None:
            d.update(predicted_step_s=None, feasible=False, reason=self.reason)
            return d
        d.update(self.candidate.summary(), feasible=True)
        if best_step_s:
            d["speedup"] = self.candidate.step_s / best_step_s
        return d


@dataclass
class SearchResult:
    problem: PlanProblem
    best: Candidate
    alternatives: list[Candidate]
    baselines: dict[str, Baseline]
    counts: Counts
    search_s: float
    mode: str
    seed: int

    @property
    def plan(self) -> Plan:
        return self.best.plan

    def speedups(self) -> dict[str, float | None]:
        return {
            k: (b.candidate.step_s / self.best.step_s if b.candidate else None)
            for k, b in self.baselines.items()
        }

    def to_dict(self) -> dict[str, Any]:
        b = self.best
        return {
            "plan": b.plan.to_dict(),
            "predicted_step_s": b.step_s,
            "tokens_per_s_per_gpu": b.prediction.tokens_per_s_per_gpu,
            "mfu": b.prediction.mfu,
            "device_memory_gb": dict(b.prediction.device_memory_gb),
            "capacity_gb": b.prediction.capacity_gb,
            "choice": b.summary(),
            "baselines": {k: v.to_dict(b.step_s) for k, v in self.baselines.items()},
            "alternatives": [
                {**a.summary(), "why_lost": why_lost(a, b)} for a in self.alternatives
            ],
            "counts": self.counts.to_dict(),
            "search_s": self.search_s,
            "mode": self.mode,
            "seed": self.seed,
            "problem": self.problem.describe(),
            "assumptions": list(b.prediction.assumptions),
        }


def why_lost(alt: Candidate, best: Candidate) -> str:
    """One line: how much slower and which unit (or offload) accounts for most of it."""
    d = alt.step_s - best.step_s
    pa, pb = alt.prediction, best.prediction
    busy_a = _busy_by_kind(pa)
    busy_b = _busy_by_kind(pb)
    diffs = {k: busy_a.get(k, 0.0) - busy_b.get(k, 0.0) for k in set(busy_a) | set(busy_b)}
    k, v = max(diffs.items(), key=lambda kv: kv[1]) if diffs else ("", 0.0)
    head = f"+{d:.1f} s ({alt.step_s / best.step_s:.2f}x)"
    if v > 0.05 * max(d, 1e-9) and k:
        return f"{head}: {k} on the critical path takes {v:+.1f} s"
    return head


def _busy_by_kind(p: StepPrediction) -> dict[str, float]:
    """Critical-path time per stage kind: for overlapped pools only the slowest pool counts."""
    out: dict[str, float] = {}
    ends: dict[str, float] = {}
    for r in p.timeline:
        ends[r.device_group] = max(ends.get(r.device_group, 0.0), r.end_s)
    crit = max(ends, key=ends.get) if ends else ""
    multi = len(ends) > 1 and len({r.start_s for r in p.timeline if r.start_s == 0.0}) > 1
    for r in p.timeline:
        if multi and r.device_group != crit:
            continue
        key = r.kind or r.stage
        out[key] = out.get(key, 0.0) + r.duration_s
    return out


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
        return self.space.layouts(c.classes[name], len(c.devices[name]))

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
            inline = c.graph.to_dict() if (st.fused or st.share_actor_critic) else None
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
            for lay, _uc in _spread(costs[n], width):
                if lay == best.layouts[n] or ev.exhausted:
                    continue
                cand = ev.candidate(c, {**best.layouts, n: lay})
                if cand is not None and cand.step_s < best.step_s - 1e-12:
                    best, improved = cand, True
        if not improved:
            break
    return best


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
    """Number of full plans in the product space (every split, every unit layout)."""
    total = 0
    for st, g in space.structures():
        for pl in space.placements(st):
            c = ev.cell(st, g, pl)
            prod = 1
            for n, _, _ in c.units:
                prod *= max(1, len(ev.candidates(c, n)))
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
    so = space_options or default_space(prob)
    opt = options or SearchOptions()
    space = SearchSpace(
        prob.base,
        prob.cluster,
        prob.model,
        num_devices=prob.num_devices,
        max_seq_tokens=prob.max_seq_tokens,
        options=so,
    )
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
    space = SearchSpace(
        prob.base,
        prob.cluster,
        prob.model,
        num_devices=prob.num_devices,
        max_seq_tokens=prob.max_seq_tokens,
        options=so,
    )
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
    from rpeg.plan.inputs import config_from_kwargs, load_config

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
    from rpeg.plan.baselines import price_baselines

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
    alts = _alternatives(results, best, opt.top_alternatives, pruned)
    return SearchResult(prob, best, alts, bl, counts, time.perf_counter() - t0, mode, opt.seed)


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


def check_problem(prob: PlanProblem) -> None:
    """Refuse problems the search cannot address (named, exit code 2)."""
    if prob.num_devices < 1:
        raise ConfigError([Problem("cluster.num_devices", "need at least one device")])
