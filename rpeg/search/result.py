"""What the optimizer returns: candidates, baselines, the search result and why
alternatives lost (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rpeg.perf.prediction import StepPrediction
from rpeg.plan.schema import Plan
from rpeg.search.problem import PlanProblem
from rpeg.search.space import (
    Counts,
    Layout,
    Placement,
    Structure,
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
class DimensionAlternative:
    """The best plan of the chosen structure and placement whose training units run at
    ``dim`` > 1 (pp or cp), or why there is none (its layouts' rejections by reason)."""

    dim: str
    candidate: Candidate | None
    reason: str = ""
    rejected: dict[str, int] = field(default_factory=dict)
    chosen: bool = False  # the chosen plan itself trains at dim > 1

    def describe(self) -> str:
        c = self.candidate
        if c is None:
            return "-"
        return ", ".join(
            f"{n} {lay.describe()} mb{lay.micro_batch_size}"
            + ("" if lay.recompute else " no-recompute")
            + f" {c.plan.units[n].engine}"
            for n, lay in c.layouts.items()
            if lay.pp > 1 or lay.cp > 1 or n in _train_units(c)
        )

    def to_dict(self, best: Candidate) -> dict[str, Any]:
        d: dict[str, Any] = {"dim": self.dim, "chosen": self.chosen}
        if self.candidate is None:
            d.update(predicted_step_s=None, reason=self.reason, rejected=dict(self.rejected))
            return d
        d.update(
            self.candidate.summary(),
            vs_chosen=self.candidate.step_s / best.step_s,
            why_lost=why_lost(self.candidate, best),
            rejected=dict(self.rejected),
        )
        return d


def _train_units(c: Candidate) -> set[str]:
    return {
        n for n, s in c.prediction.stages.items() if {"train_actor", "train_critic"} & set(s.kinds)
    }


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
    # the best plan's predicted range (low, high) s; None before it is computed
    step_range: tuple[float, float] | None = None
    # per parallel dimension (pp, cp): the best plan training at it, or why none
    dimensions: dict[str, DimensionAlternative] = field(default_factory=dict)

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
            "predicted_range_s": list(self.step_range) if self.step_range else None,
            "tokens_per_s_per_gpu": b.prediction.tokens_per_s_per_gpu,
            "mfu": b.prediction.mfu,
            "device_memory_gb": dict(b.prediction.device_memory_gb),
            "capacity_gb": b.prediction.capacity_gb,
            "choice": b.summary(),
            "baselines": {k: v.to_dict(b.step_s) for k, v in self.baselines.items()},
            "alternatives": [
                {**a.summary(), "why_lost": why_lost(a, b)} for a in self.alternatives
            ],
            "dimensions": {k: v.to_dict(b) for k, v in self.dimensions.items()},
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
    nd = 2 if best.step_s < 10 else 1  # CPU-sized steps need the hundredths
    head = f"+{d:.{nd}f} s ({alt.step_s / best.step_s:.2f}x)"
    if d <= 0.005 * best.step_s:
        return f"{head}: same predicted step as the best (within 0.5%); not a real difference"
    if v > 0.05 * max(d, 1e-9) and k:
        return f"{head}: {k} on the critical path takes {v:+.{nd}f} s"
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
