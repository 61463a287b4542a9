"""The execution plan as data: :class:`Plan` (structure, placement and per-unit layouts of one
RL step), its YAML form and the common layouts (pure; ``rpeg.plan.schema``). The optimizer
that searches plans lives above the performance model, in :mod:`rpeg.search`."""

from rpeg.plan.schema import (
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
    "GraphRef",
    "InfeasiblePlan",
    "Plan",
    "UnitPlan",
    "colocated_plan",
    "disaggregated_plan",
    "format_devices",
    "parse_devices",
]
