"""rpeg.tasks: thin Prefect tasks, one per stage kind / fused group, that call actor groups
through the run's :class:`rpeg.runtime.actors.driver.DistributedRun`."""

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
    "sync_weights_task",
    "take_task",
]
