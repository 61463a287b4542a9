"""Which step-scheduler instruction runs how: as a Prefect task run or as a direct call.

:func:`submit` is the one table from an instruction of
:mod:`rpeg.runtime.step.scheduler` (those that report back with an event) to what carries
it out; the flow calls it for every such instruction and knows no task by name.

Execution units (``RunUnit``) and ``Take`` run as *direct* calls into the driver on the
flow's thread pool (``pool``), not as Prefect task runs: there are several per step (seven
for the built-in config), each a few ms of actor work at small shapes, and a task run costs
6-10 ms in the flow process plus Prefect-server CPU that competes with the actors for the
cores; measured on the built-in config at one rank, the actor's own stages took 0.30 s per
step with a task run per unit against 0.175 s with direct calls (docs/measurements.md;
docs/step.md "Flow dispatch"). The UI shows each step through its progress artifact and log line; the units'
spans are in the measured timeline. Rollouts, weight syncs, checkpoints and evaluations stay
task runs (one or two per step, coarse). Without a ``pool`` every instruction is a Prefect
task run (the dispatch before; ``benchmarks/bench_dispatch.py`` compares the two).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from rpeg.tasks.unit_tasks import (
    checkpoint_task,
    evaluate_task,
    rollout_task,
    run_unit_task,
    sync_weights_task,
    take_task,
)

from rpeg.runtime.step import messages as M

#: instructions executed as direct driver calls when the flow gives a pool
DIRECT = (M.RunUnit, M.Take)


class Inline(Executor):
    """An executor that runs the call in the submitting thread and returns a done future.

    The flow uses it when the instruction is the only work in flight and none is queued: the
    flow would only wait for it, and running it in place saves two thread hand-offs per unit
    (the pool thread and back)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 -- delivered through the future
            fut.set_exception(exc)
        return fut


def submit(run: Any, ins: Any, pool: Executor | None = None) -> Any:
    """Submit ``ins``: a future (Prefect's, or the pool's for :data:`DIRECT` instructions)
    whose result is the driver's; ``ins.done(result)`` is its event."""
    if pool is not None and isinstance(ins, DIRECT):
        if isinstance(ins, M.RunUnit):
            return pool.submit(run.run_unit, ins.step, ins.unit)
        return pool.submit(run.take, ins.step)
    if isinstance(ins, M.RunUnit):
        return run_unit_task.submit(run, ins.step, ins.unit)
    if isinstance(ins, M.Rollout):
        return rollout_task.submit(run, ins.step)
    if isinstance(ins, M.Take):
        return take_task.submit(run, ins.step)
    if isinstance(ins, M.SyncWeights):  # the weights of version v come from step v-1's update
        return sync_weights_task.submit(run, ins.version - 1)
    if isinstance(ins, M.Checkpoint):
        return checkpoint_task.submit(run, ins.step_done, ins.state)
    if isinstance(ins, M.Evaluate):
        return evaluate_task.submit(run, ins.when)
    raise TypeError(f"no task executes {ins!r}")
