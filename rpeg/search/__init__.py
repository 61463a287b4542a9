"""The optimizer (pure): searches structure, placement and per-unit layouts of an RL step
(``optimize``: rpeg.search.optimizer over rpeg.search.space), prices every candidate with
rpeg.perf, compares with the verl/ReaL/AReaL-style baselines (rpeg.search.baselines) and
reports (rpeg.search.report). See docs/optimizer.md."""

from rpeg.search.optimizer import optimize
from rpeg.search.result import Candidate, SearchResult
from rpeg.search.space import Layout, Placement, SpaceOptions, Structure

__all__ = [
    "Candidate",
    "Layout",
    "Placement",
    "SearchResult",
    "SpaceOptions",
    "Structure",
    "optimize",
]
