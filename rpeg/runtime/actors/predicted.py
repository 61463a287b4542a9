"""What the runtime takes from the performance model's prediction for the run's plan.

* :func:`collective_timeout_s` -- how long a rank waits at a collective (the process
  groups' ``timeout``), below.
* :func:`unit_memory_gib` -- the predicted peak memory per device of every execution unit,
  named when a unit runs out of memory (rpeg.runtime.step.scheduler).

Collective timeouts:

A data-parallel rank that finished its share of the rollouts waits at the next collective
(the gradient all-reduce, FSDP's gathers) for the slowest rank; NCCL's watchdog aborts the
whole run when that wait passes the group's timeout. torch's default for NCCL is 10 min and
the runtime used 120 s: a long rollout (long responses, a big model) outlasts either.

:func:`collective_timeout_s` is ``runtime.collective_timeout_s`` when set, else the larger of
:data:`MIN_COLLECTIVE_TIMEOUT_S` and :data:`STEP_MARGIN` times the step the performance model
predicts for the run's plan (the whole step bounds any one rank's rollout).
"""

from __future__ import annotations

import logging
from typing import Any

#: the floor of the derived timeout: 30 minutes (torch's own default for gloo)
MIN_COLLECTIVE_TIMEOUT_S = 1800.0
#: the derived timeout is this many predicted steps (the prediction is a model, not a bound)
STEP_MARGIN = 4.0

log = logging.getLogger(__name__)


def prediction(config: Any) -> Any:
    """The performance model's StepPrediction for ``config``'s plan (None if it cannot price
    it: the run goes on; what needs the figure says it has none)."""
    try:
        from rpeg.compile import resolve
        from rpeg.perf import Workload, predict
        from rpeg.specs.hf import priced_model

        graph, plan = resolve(None, config)  # the run's graph (a multi-turn run's env stage)
        wl = Workload.from_config(config.workload, config.model.lora, config.task.multiturn)
        # the run's model (model.path's config.json, else model.name), not the plan's default
        model = priced_model(config.model)
        return predict(graph, plan, wl, model=model)
    except Exception as exc:  # noqa: BLE001 - a figure for messages and timeouts, not the run
        log.warning("no prediction for this run's plan (%s)", exc)
        return None


def predicted_step_s(config: Any) -> float | None:
    """The predicted step time (None without a prediction)."""
    pred = prediction(config)
    return None if pred is None else float(pred.step_s)


def unit_memory_gib(config: Any, pred: Any = None) -> dict[str, float]:
    """Execution unit -> its predicted peak memory per device, GiB ({} without a
    prediction)."""
    pred = prediction(config) if pred is None else pred
    if pred is None:
        return {}
    return {name: st.peak_memory_gb * 1e9 / 2**30 for name, st in pred.stages.items()}


def collective_timeout_s(config: Any, step_s: float | None = None) -> float:
    """The process groups' timeout (module doc). ``step_s``: the predicted step (None: ask
    the performance model)."""
    set_s = config.runtime.collective_timeout_s
    if set_s is not None:
        return float(set_s)
    if step_s is None:
        step_s = predicted_step_s(config)
    return max(MIN_COLLECTIVE_TIMEOUT_S, STEP_MARGIN * (step_s or 0.0))
