"""Plan -> Prefect flow wiring.

``compile_plan(plan_or_graph, config)`` returns a :class:`CompiledStep` (plain data: actor
groups, ordered tasks with dependencies and concurrency, weight sync, staleness buffer) that
serializes to YAML/JSON; :func:`rpeg.flows.train.rl_train` executes it. Pure: no torch,
dask or prefect here.
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
