"""Thin Prefect tasks: each is one call into the driver (which calls the actors).

They run on Prefect's default (thread) task runner in the flow process; caching is off
(their inputs are live handles); the step scheduler (rpeg.runtime.step.scheduler) decides
what runs when and what a failure means (a lost worker rolls the run back to its last
checkpoint), and ``rpeg.tasks.dispatch.submit`` maps its instructions to these tasks.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

_OPTS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "log_prints": False}


def _named(label: str, step_key: str = "step", offset: int = 1):
    """A task-run name callable: ``<label> step <n>`` with steps counted from 1 as in the
    logs (``label`` may be ``{unit}``, the unit's name)."""

    def name(parameters: dict[str, Any]) -> str:
        head = label.format(**parameters)
        step = parameters.get(step_key)
        return f"{head} step {int(step) + offset}" if isinstance(step, int) else head

    return name


@task(name="unit", task_run_name=_named("{unit}"), **_OPTS)
def run_unit_task(run: Any, step: int, unit: str) -> dict[str, float]:
    """One stage or fused group of ``step`` on its actor group."""
    return run.run_unit(step, unit)


@task(name="rollout", task_run_name=_named("rollout"), **_OPTS)
def rollout_task(run: Any, step: int) -> dict[str, float]:
    """Generate the batch of ``step`` on the rollout group (admitted by the step scheduler)."""
    return run.rollout(step)


@task(name="take", task_run_name=_named("take batch"), **_OPTS)
def take_task(run: Any, step: int) -> dict[str, float]:
    """Move the step's batch from the staleness buffer to the trainer group."""
    return run.take(step)


@task(name="sync weights", task_run_name=_named("sync weights"), **_OPTS)
def sync_weights_task(run: Any, step: int) -> dict[str, float]:
    """Bucketed trainer -> generator weight sync (async layouts)."""
    return run.sync_weights(step)


@task(name="checkpoint", task_run_name=_named("checkpoint after", "step_done", 0), **_OPTS)
def checkpoint_task(run: Any, step_done: int, state: dict[str, Any]) -> dict[str, float]:
    """Save after ``step_done`` steps (``state``: the step scheduler's)."""
    return run.checkpoint(step_done, state)


@task(name="evaluate", task_run_name="evaluate {when}", **_OPTS)
def evaluate_task(run: Any, when: str = "after") -> dict[str, float]:
    """Validation metrics on the trainer's rank 0 (``when``: before or after training, or
    after a step: rpeg.runtime.validation)."""
    return run.evaluate()
