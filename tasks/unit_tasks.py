"""Thin Prefect tasks: each is one call into the driver (which calls the actors).

They run on Prefect's default (thread) task runner in the flow process; caching is off
(their inputs are live handles) and retries are handled at the step level by the flow
(a lost worker rolls the run back to its last checkpoint).
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

_OPTS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "log_prints": False}


@task(name="unit", task_run_name="{unit}[{step}]", **_OPTS)
def run_unit_task(run: Any, step: int, unit: str) -> dict[str, float]:
    """One stage or fused group of ``step`` on its actor group."""
    return run.run_unit(step, unit)


@task(name="rollout", task_run_name="rollout[next]", **_OPTS)
def rollout_task(run: Any, timeout_s: float) -> int:
    """Generate the next admitted batch (blocks while more than k versions ahead)."""
    return run.rollout(timeout_s)


@task(name="take", task_run_name="take[{step}]", **_OPTS)
def take_task(run: Any, step: int, timeout_s: float) -> dict[str, float]:
    """Move the step's batch from the staleness buffer to the trainer group."""
    return run.take(step, timeout_s)


@task(name="sync_weights", task_run_name="sync_weights[{step}]", **_OPTS)
def sync_weights_task(run: Any, step: int) -> dict[str, float]:
    """Bucketed trainer -> generator weight sync (async layouts)."""
    return run.sync_weights(step)


@task(name="checkpoint", task_run_name="checkpoint[{step_done}]", **_OPTS)
def checkpoint_task(run: Any, step_done: int) -> dict[str, float]:
    return run.checkpoint(step_done)


@task(name="evaluate", **_OPTS)
def evaluate_task(run: Any) -> float:
    """Greedy held-out accuracy on the trainer's rank 0."""
    with run.client.as_current():
        return run.groups[run.compiled.trainer_group][0].evaluate().result()
