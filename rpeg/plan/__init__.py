"""Execution plans (pure): the Plan type and common layouts. Search modules come later."""

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
    "GraphRef",
    "InfeasiblePlan",
    "Plan",
    "UnitPlan",
    "colocated_plan",
    "disaggregated_plan",
    "format_devices",
    "parse_devices",
]
