"""The run's step compiled for one process (the local trainer, ``rpeg train --local``): the
graph and the per-unit settings (micro-batch size, token budget) of the run's plan -- its own
or the default one -- with every unit on device 0 at every parallel degree 1, so the single-process trainer
executes the same compiled step as the actors (its staleness bound, its units in order).
Pure."""

from __future__ import annotations

from typing import Any

from rpeg.compile.compiler import compile_step
from rpeg.compile.sources import resolve
from rpeg.compile.step import CompiledStep

#: a unit's parallel degrees in one process (the plan's micro-batching is kept)
ONE_DEVICE = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 0}


def compile_local(config: Any, model: Any = None) -> CompiledStep:
    """One actor group on one device running every unit of the run's step (``model``: the
    policy's ModelSpec read from its folder, as :func:`compile_step` takes it)."""
    _graph, plan = resolve(None, config)
    units = {n: u.model_copy(update={"devices": (0,), **ONE_DEVICE}) for n, u in plan.units.items()}
    plan = plan.model_copy(update={"units": units})
    return compile_step(plan, config, cluster_devices=1, model=model)
