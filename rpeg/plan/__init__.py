"""Execution plans: the Plan type and common layouts (pure, rpeg.plan.plan), and the
optimizer over structure, placement and per-unit layouts (``optimize``: rpeg.plan.search,
rpeg.plan.space, baselines in rpeg.plan.baselines, the report in rpeg.plan.report; see
docs/optimizer.md). Every candidate is priced by rpeg.perf."""

from rpeg.plan.plan import (
    GraphRef,
    InfeasiblePlan,
    Plan,
    UnitPlan,
    colocated_plan,
    disaggregated_plan,
    format_devices,
    parse_devices,
)

__all__ = [
    "Candidate",
    "Layout",
    "Placement",
    "SearchResult",
    "SpaceOptions",
    "Structure",
    "optimize",
    "GraphRef",
    "InfeasiblePlan",
    "Plan",
    "UnitPlan",
    "colocated_plan",
    "disaggregated_plan",
    "format_devices",
    "parse_devices",
]

# The optimizer imports rpeg.perf, which imports rpeg.plan.plan: load it lazily so that
# ``import rpeg.perf`` first does not meet a half-initialised rpeg.plan.
_LAZY = {
    "Candidate": "rpeg.plan.search",
    "SearchResult": "rpeg.plan.search",
    "optimize": "rpeg.plan.search",
    "Layout": "rpeg.plan.space",
    "Placement": "rpeg.plan.space",
    "SpaceOptions": "rpeg.plan.space",
    "Structure": "rpeg.plan.space",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rpeg.plan' has no attribute {name!r}")
