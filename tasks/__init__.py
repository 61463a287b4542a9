"""rpeg.tasks: how the flow executes a step-scheduler instruction. :func:`submit`
(``dispatch.py``) runs units and takes as direct calls into the run's
:class:`rpeg.runtime.actors.driver.DistributedRun` and rollouts, weight syncs, checkpoints and
evaluations as thin Prefect tasks (``unit_tasks.py``). Without a pool, units and takes are
task runs too (every instruction a task run: what ``benchmarks/bench_dispatch.py`` compares).
docs/step.md "Flow dispatch"."""

from rpeg.tasks.dispatch import submit
from rpeg.tasks.unit_tasks import (
    checkpoint_task,
    evaluate_task,
    rollout_task,
    run_unit_task,
    sync_weights_task,
    take_task,
)

__all__ = [
    "checkpoint_task",
    "evaluate_task",
    "rollout_task",
    "run_unit_task",
    "submit",
    "sync_weights_task",
    "take_task",
]
