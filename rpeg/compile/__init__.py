"""Plan -> CompiledStep: the program the runtime executes (docs/compile.md).

``compile_plan(plan_or_graph, config)`` resolves the run graph (``sources.resolve``), checks
units, roles, devices and layouts (``compiler.check_step``) and returns a
:class:`CompiledStep` (plain data: actor groups with their layouts, ordered execution units
with dependencies and concurrency, weight sync, staleness buffer) that serializes to
YAML/JSON; :func:`rpeg.flows.train.rl_train` executes it. No torch, dask or prefect here;
the layout check reads the model folder's ``config.json`` when ``model.path`` is one.
"""

from rpeg.compile.compiler import check_step, compile_step
from rpeg.compile.sources import default_plan, graph_from_config, resolve, staleness_bound
from rpeg.compile.step import ActorGroupSpec, CompiledStep, TaskSpec


def compile_plan(plan_or_graph, config, *, cluster_devices: int | None = None) -> CompiledStep:
    """Compile a Plan (or a Graph with the default plan, or None = from ``config``)."""
    return compile_step(plan_or_graph, config, cluster_devices=cluster_devices)


__all__ = [
    "ActorGroupSpec",
    "CompiledStep",
    "TaskSpec",
    "check_step",
    "compile_plan",
    "compile_step",
    "default_plan",
    "graph_from_config",
    "resolve",
    "staleness_bound",
]
