"""The one training entry :func:`train` (``rpeg train``, ``--local`` or not, the deployed
flows and Python all call it) and the training flow it starts (Prefect name ``train``;
Python :func:`rl_train`, config as a dict). Deployments run the same entry from a typed form
(:mod:`rpeg.flows.train_form`) under the same flow name.

Prefect drives, Dask executes: the flow compiles the plan, validates everything (devices,
roles, checkpoint URL) *before* any actor starts, brings up the cluster and one actor per
rank, then executes the instructions of the step scheduler
(:mod:`rpeg.runtime.step.scheduler`: which unit, rollout, take, weight sync or checkpoint
comes next) -- units as direct calls, rollouts, weight syncs, checkpoints and evaluations
as thin Prefect tasks (``rpeg.tasks.dispatch`` says why) -- and feeds each result back as
an event; it decides nothing itself. A lost worker is a ``Recover`` instruction: the flow re-creates the actors
from the last checkpoint and drives on (no step counted twice, no sample lost or used twice).

What happens before any actor starts is :mod:`rpeg.flows.run_setup`; where a finished step
goes (metrics, progress, artifacts), :mod:`rpeg.flows.step_sink`.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow  # noqa: E402
from rpeg.flows.launch import config_run_name, run_logger  # noqa: E402
from rpeg.flows.run_setup import (  # noqa: E402
    handed_step,
    setup_run,
    stall_monitor,
    startup_phase,
    warm_up_before_ranks,
)
from rpeg.flows.step_sink import StepSink, publish_guarded  # noqa: E402

from rpeg.config import RunConfig  # noqa: E402

log = logging.getLogger("rpeg.flows.train")


def _outcome(ins: Any, fut: Any) -> Any:
    """The event of a finished task: its result, or a lost worker / out-of-memory (by the
    exception's type); any other error is raised as it is."""
    from rpeg.runtime.actors.failures import classify
    from rpeg.runtime.step import messages as M

    try:
        res = fut.result()
    except Exception as exc:
        kind = classify(exc)
        if kind == "worker_lost":
            return M.WorkerLost(ins, exc)
        if kind == "oom":
            return M.OutOfMemory(ins, exc)
        raise
    return ins.done(res)


def _drive(run: Any, sched: Any, event: Any, sink: StepSink, hook: Any) -> Any:
    """Execute the scheduler's instructions, feeding every result back as an event, until it
    says Finish or Recover (returned); Fail is raised. Decides nothing.

    Units and takes run as direct calls (in place when they are the only work in flight,
    else on a small thread pool), everything else as Prefect task runs (``rpeg.tasks.dispatch``); a step's record (metrics file, progress, artifacts)
    is written in the sink's own thread, off the path from one step to the next."""
    import queue
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from rpeg.tasks import submit
    from rpeg.tasks.dispatch import Inline

    from rpeg.runtime.step import messages as M

    finished: queue.Queue = queue.Queue()
    running: dict[Any, Any] = {}  # future -> instruction
    todo = deque(sched.handle(event))
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rpeg-unit")
    # a step's rows are dropped without waiting for the ranks (a round trip to every rank
    # holding them, ~5 ms of every step): the drops are checked at the next Release and at
    # Finish, where a failed one is raised (a recovery re-creates the actors anyway)
    releases: list[Any] = []
    inline = Inline()
    try:
        while True:
            while todo:
                ins = todo.popleft()
                if isinstance(ins, M.Finish | M.Recover):
                    recovering = isinstance(ins, M.Recover)
                    if not recovering:  # every drop done before the summary's rank info
                        _released(releases)
                    releases.clear()
                    _abandon(run, running, recovering=recovering)
                    return ins
                if isinstance(ins, M.Fail):
                    raise ins.exception()
                if isinstance(ins, M.BeginStep):
                    run.timeline.begin_step(ins.step)
                    if hook is not None:
                        hook(run, ins.step)
                elif isinstance(ins, M.Release):
                    _released(releases)  # the previous steps' drops, long done
                    releases.extend(run.release_nowait(ins.step))
                elif isinstance(ins, M.EndStep):
                    seconds = run.timeline.end_step(ins.step)
                    todo.extend(
                        sched.handle(M.StepEnded(ins.step, seconds, run.step_metrics(ins.step)))
                    )
                elif isinstance(ins, M.Record):
                    sink.record(ins, sched.history)
                else:  # the only work in flight and nothing queued: run it in place
                    if isinstance(ins, M.Evaluate):
                        sink.evaluating(ins.when)
                    here = inline if not running and not todo else pool
                    fut = submit(run, ins, here)
                    running[fut] = ins
                    fut.add_done_callback(finished.put)
            fut = finished.get()
            event = _outcome(running.pop(fut), fut)
            if isinstance(event, M.Evaluated):
                sink.evaluated(event.when, event.accuracy, event.metrics)
            todo.extend(sched.handle(event))
    finally:
        pool.shutdown(wait=False)


def _released(drops: list[Any]) -> None:
    """Wait for the ranks' drops sent by ``DistributedRun.release_nowait`` (a failed one
    raises its error) and forget them."""
    while drops:
        drops.pop(0).result()


def _abandon(run: Any, running: dict[Any, Any], *, recovering: bool) -> None:
    """Before a recovery: restart or close the surviving actors first (a rank blocked in a
    collective with the dead one returns only then), then wait for every task still running
    so that none writes into the restored state."""
    import concurrent.futures
    import contextlib

    if recovering:
        run.abandon()
    for fut in running:
        with contextlib.suppress(Exception):
            if isinstance(fut, concurrent.futures.Future):  # a direct call (dispatch.DIRECT)
                concurrent.futures.wait([fut], timeout=120)
            else:
                fut.wait(timeout=120)
    running.clear()


def train_body(
    config: RunConfig,
    *,
    cluster_address: str | None = None,
    resume: bool = False,
    summary_json: str | None = None,
    progress: bool = True,
    cluster: Any = None,
    fault_hook: Any = None,
    compiled: Any = None,
) -> dict[str, Any]:
    """The training flow's body: set up, then execute the step scheduler's instructions;
    a lost worker is a Recover instruction, answered by re-creating the actors from the last
    checkpoint (``run.recover``) and driving on. ``compiled``: the step already compiled and
    checked for ``config`` (rpeg.preflight.prepare), else it is compiled here."""
    from rpeg.runtime.actors.driver import DistributedRun
    from rpeg.runtime.actors.failures import start_with_retries
    from rpeg.runtime.step import messages as M
    from rpeg.runtime.step import scheduler as S

    t_start = time.perf_counter()
    c, compiled, cl, owned = setup_run(config, cluster_address, resume, cluster, progress, compiled)
    out = Path(c.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compiled_step.yaml").write_text(compiled.to_yaml())
    run = DistributedRun(c, compiled, cl)
    sched = S.StepScheduler.from_compiled(
        compiled,
        c.runtime.steps,
        checkpoint_every=c.runtime.checkpoint_every if run.store is not None else None,
        max_recoveries=c.runtime.step_retries,
        val_every=c.runtime.val_every,
        val_before_train=c.runtime.val_before_train,
    )
    from rpeg.runtime.actors.predicted import unit_memory_gib

    sched.predicted_memory_gib = unit_memory_gib(c)  # named if a unit runs out of memory
    initial = sched.state_dict()  # what a recovery before any checkpoint starts from
    sink = StepSink(out, c.runtime.steps, progress, run.checkpoint_url, c)
    from rpeg.runtime.degenerate import DegenerateWatch

    sink.watch = DegenerateWatch(
        c.runtime.degenerate_steps_limit, greedy=c.workload.temperature == 0
    )
    sink.samples_from = run.logged_samples  # samples.jsonl's rows -> a Prefect table artifact
    rlog = run_logger()
    monitor = None
    try:
        # CPU ranks: the warm-up once, here, so that its progress is shown (not per rank)
        warm_up_before_ranks(c, compiled, log=sink.say, progress=progress)
        n = sum(len(g.devices) for g in compiled.actor_groups)
        startup_phase(
            progress,
            "starting %d actors in %d group(s); models load now",
            n,
            len(compiled.actor_groups),
        )
        start_with_retries(run, c.runtime.step_retries, warn=rlog.warning)
        monitor = stall_monitor(run, cl, c.runtime)
        startup_phase(
            progress, "actors ready (models loaded, warmed up) in %.1f s", run.actor_start_s
        )
        state = run.restore() if c.runtime.resume else None
        if state is not None:
            rlog.info("resumed from checkpoint at step %d", state["step"])
            sink.say(f"resumed at step {state['step']} (run {c.runtime.run_id})")
        ins = _drive(run, sched, M.Start(state), sink, fault_hook)
        while isinstance(ins, M.Recover):
            log.warning("%s; recovering from the last checkpoint", ins.reason)
            state = run.recover()  # None: lost before the first checkpoint: from the start
            ins = _drive(run, sched, M.Recovered(state or initial), sink, fault_hook)
        checksums = run.param_checksums()
    finally:
        if monitor is not None:
            monitor.stop()
        try:
            run.close()
            if owned:
                cl.close()
        finally:
            sink.close()  # waits for the last records; raises a failed write's error
    resumed_at = int(state["step"]) if state is not None else 0
    wall_s = time.perf_counter() - t_start
    summary = _finish(run, sched, out, summary_json, wall_s, checksums, resumed_at)
    # steps run by this call (the summary's steps count the resumed run's from its start)
    summary["steps_run"] = summary["steps"] - resumed_at
    return summary


def _finish(
    run: Any,
    sched: Any,
    out: Path,
    summary_json: str | None,
    wall_s: float,
    checksums: Any,
    resumed_at: int = 0,
) -> dict[str, Any]:
    """The summary (rpeg.runtime.summary), timeline.json and the ``_extra`` of tests; after a
    resume both cover the whole run (``resumed_at``: the steps restored)."""
    from rpeg.runtime.summary import resumed_timeline, run_summary

    hist = [sched.history[s] for s in sorted(sched.history)]
    summary = run_summary(
        hist,
        wall_s=wall_s,
        acc_before=sched.acc_before,
        acc_after=sched.acc_after,
        resumed_at=resumed_at,
    )
    summary.update(run.summary_extras(hist))
    # lost workers this call recovered from, and the samples they made it generate again
    # (begun before the loss, not in the checkpoint: rpeg.runtime.step.regeneration)
    summary["recoveries"] = sched.recoveries
    summary["regenerated_samples"] = sched.regenerated_samples
    now = {
        "records": [r.to_dict() for r in run.timeline.records],
        "step_offsets_s": {str(k): v for k, v in run.timeline.step_offsets().items()},
        "stage_spans": list(run.timeline.stage_spans),
        "pipeline_actions": list(run.timeline.pipeline_actions),
    }
    timeline = resumed_timeline(out / "timeline.json", now, resumed_at)
    (out / "timeline.json").write_text(json.dumps(timeline))
    if summary_json:
        Path(summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(summary_json).write_text(json.dumps(summary, indent=1))
    summary["_extra"] = {
        "recoveries": sched.recoveries,
        "param_checksums": checksums,
        "actor_start_s": run.actor_start_s,
        "timeline": timeline["records"],
        "step_offsets_s": timeline["step_offsets_s"],
        "stage_spans": timeline["stage_spans"],
        "weight_sync": run.sync_log,
        "history": hist,
    }
    return summary


@flow(
    name="train",
    flow_run_name=config_run_name,
    persist_result=False,
    log_prints=False,
    validate_parameters=True,
)
def rl_train(
    config: dict[str, Any] | None = None,
    cluster_address: str | None = None,
    resume: bool = False,
    summary_json: str | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """RL training on Dask actors driven by Prefect (see module docstring)."""
    cfg = RunConfig.from_dict(config)
    s = train_body(
        cfg,
        cluster_address=cluster_address,
        resume=resume,
        summary_json=summary_json,
        progress=progress,
        compiled=handed_step(cfg),  # checked by train() before it started this flow
    )
    publish_guarded("publish_results", s, cfg.runtime.output_dir)
    s.pop("_extra", None)
    _body_finished(s)
    return s


#: where the flow body that returns puts its summary for :func:`finished_despite_api` (a
#: list set for that call only: a sync flow runs in its caller's thread and context)
_BODY_DONE: ContextVar[list[dict[str, Any]] | None] = ContextVar("rpeg_body_done", default=None)


def _body_finished(summary: dict[str, Any]) -> None:
    """The flow body returned ``summary`` (outputs written): told to the waiting caller."""
    done = _BODY_DONE.get()
    if done is not None:
        done.append(summary)


def finished_despite_api(call: Any) -> dict[str, Any]:
    """``call()`` (a flow run); if it raises because the Prefect API stopped answering *after*
    the flow body returned, the body's summary with a warning instead: training finished and
    wrote its outputs, only the run's final state is missing from the API (the UI shows it
    Running). Measured: the ephemeral API killed mid-run; all 60 steps, the metrics and the
    summary were done, then ``error: ConnectError`` and exit 1 after ~60 s of retries."""
    from rpeg.flows.api_calls import unreachable

    done: list[dict[str, Any]] = []
    token = _BODY_DONE.set(done)
    try:
        return call()
    except Exception as exc:
        if not done or not unreachable(exc):
            raise
        logging.getLogger("rpeg.flows.train").warning(
            "training finished, but the Prefect API stopped answering (%s: %s): this flow "
            "run's final state was not recorded",
            type(exc).__name__,
            exc,
        )
        return done[-1]
    finally:
        _BODY_DONE.reset(token)
