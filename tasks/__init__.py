"""rpeg.tasks: thin Prefect tasks (one generic unit task, rollout, take, weight sync,
checkpoint, evaluate) that call actor groups through the run's
:class:`rpeg.runtime.actors.driver.DistributedRun`; :func:`submit` maps a step-scheduler
instruction to its task."""

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
