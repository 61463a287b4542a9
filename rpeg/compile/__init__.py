"""Plan -> CompiledStep: the program the runtime executes (docs/compile.md).

``compile_plan(plan_or_graph, config)`` resolves the run graph (``sources.resolve``), checks
units, roles, devices and layouts (``checks``, ``layouts``) and returns a frozen, typed
:class:`CompiledStep` (actor groups with their layouts, ordered execution units with
dependencies, concurrency and micro-batching, weight sync, staleness buffer) that serializes
to YAML/JSON; :func:`rpeg.flows.train.rl_train` executes it. No torch, dask or prefect here,
and no model file read: the caller passes the policy's spec read from a model folder.
"""

from typing import Any

from rpeg.compile.checks import check_step
from rpeg.compile.compiler import compile_step
from rpeg.compile.local import compile_local
from rpeg.compile.sources import default_plan, graph_from_config, resolve
from rpeg.compile.step import (
    Buffer,
    CompiledStep,
    GroupSpec,
    TaskSpec,
    WeightSync,
)


def compile_plan(
    plan_or_graph: Any, config: Any, *, cluster_devices: int | None = None, model: Any = None
) -> CompiledStep:
    """Compile a Plan (or a Graph with the default plan, or None = from ``config``);
    ``model``: the policy's spec read from a model folder by the caller (compile reads no
    model file)."""
    return compile_step(plan_or_graph, config, cluster_devices=cluster_devices, model=model)


__all__ = [
    "Buffer",
    "CompiledStep",
    "GroupSpec",
    "TaskSpec",
    "WeightSync",
    "check_step",
    "compile_local",
    "compile_plan",
    "compile_step",
    "default_plan",
    "graph_from_config",
    "resolve",
]
