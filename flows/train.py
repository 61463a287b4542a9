"""The training flow (Prefect name ``train``; Python :func:`rl_train`, config as a dict) and
its Python entry :func:`run_train`. Deployments run the same loop from a typed form
(:mod:`rpeg.flows.train_form`) under the same flow name.

Prefect drives, Dask executes: the flow compiles the plan, validates everything (devices,
roles, checkpoint URL) *before* any actor starts, brings up the cluster and one actor per
rank, then executes the instructions of the step scheduler
(:mod:`rpeg.runtime.actors.scheduler`: which unit, rollout, take, weight sync or checkpoint
comes next) -- units as direct calls, rollouts, weight syncs, checkpoints and evaluations
as thin Prefect tasks (``rpeg.tasks.dispatch`` says why) -- and feeds each result back as
an event; it decides nothing itself. A lost worker is a ``Recover`` instruction: the flow re-creates the actors
from the last checkpoint and drives on (no step counted twice, no sample lost or used twice).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow  # noqa: E402
from rpeg.flows.launch import config_run_name, run_logger  # noqa: E402

from rpeg.config import RunConfig  # noqa: E402

log = logging.getLogger("rpeg.flows.train")


def validate_before_start(config: RunConfig, cluster_devices: int | None = None):
    """Compile and check every input; raises ConfigError listing all problems."""
    from rpeg.preflight import preflight
    from rpeg.runtime.engines.choice import check_engine

    # model, task data, rewards, template, places, machine and the plan, all at once
    compiled = preflight(config, cluster_devices=cluster_devices)
    check_engine(config, compiled)
    return compiled


def _artifacts(fn: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``rpeg.flows.artifacts.<fn>`` (the ops helpers: Prefect progress/table/link
    artifacts); an artifact is never worth a failed step, so any error is logged and dropped."""
    try:
        from rpeg.flows import artifacts

        return getattr(artifacts, fn)(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        log.warning("artifact %s skipped: %s", fn, exc)
        return None


#: progress-bar redraws per second (rich's default, 10, took ~0.05 of a core in the flow
#: process on a terminal -- CPU the ranks share -- for a bar that moves once per step)
REFRESH_PER_S = 2


class _Progress:
    """A bar on a terminal; one line per step when stdout is not one (a log file, SLURM, CI),
    where a bar shows nothing until the end."""

    def __init__(self, total: int, enabled: bool):
        import sys

        self.enabled = enabled
        self.p = None
        self.total = total
        self.lines = enabled and not sys.stdout.isatty()
        if enabled and not self.lines:
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.p = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("reward {task.fields[reward]:.3f}"),
                TextColumn("{task.fields[tps]:.0f} tok/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
                refresh_per_second=REFRESH_PER_S,
            )
            self.t = self.p.add_task("rl", total=total, reward=0.0, tps=0.0)
            self.p.start()

    def update(self, done: int, m: dict[str, float]) -> None:
        if self.lines:
            print(
                f"step {done}/{self.total}: reward {m.get('reward_mean', 0.0):.3f} "
                f"acc {m.get('accuracy', 0.0):.3f} len {m.get('response_length', 0.0):.1f} "
                f"{m.get('step_s', 0.0):.2f}s {m.get('tokens_per_s', 0.0):.0f} tok/s",
                flush=True,
            )
        if self.p is not None:
            self.p.update(
                self.t,
                completed=done,
                reward=m.get("reward_mean", 0.0),
                tps=m.get("tokens_per_s", 0.0),
            )

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()


class _Metrics:
    """metrics.jsonl (+ ``runtime.loggers``); a rewritten step replaces its line."""

    def __init__(self, out: Path, config: Any = None):
        from rpeg.runtime.loggers import RunLoggers

        self.path = out / "metrics.jsonl"
        self.tb = RunLoggers(out, config)  # as the local trainer's

    def append(self, metrics: dict[str, float]) -> None:
        """One step's line at the end of the file (the common case: the next step)."""
        with open(self.path, "a") as fh:
            fh.write(json.dumps(metrics) + "\n")

    def write_all(self, metrics: dict[int, dict[str, float]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            for s in sorted(metrics):
                fh.write(json.dumps(metrics[s]) + "\n")
        os.replace(tmp, self.path)

    def scalar(self, step: int, m: dict[str, float]) -> None:
        self.tb.add(step + 1, m)  # the console's count

    def close(self) -> None:
        self.tb.close()


class _Sink:
    """Where a finished step goes: metrics.jsonl (the next step's line appended; the first
    record and a step recomputed after a recovery rewrite the file, so that step replaces
    its line), TensorBoard when installed, the progress
    bar and the Prefect artifacts. Written by one thread of its own, in order (a record costs
    10-50 ms of file and Prefect API work that the next step need not wait for);
    :meth:`close` waits for every record and raises the first error."""

    def __init__(
        self, out: Path, steps: int, progress: bool, checkpoint_url: Any, config: Any = None
    ):
        from concurrent.futures import ThreadPoolExecutor

        self.steps = steps
        self.metrics = _Metrics(out, config)
        self.progress = _Progress(steps, progress)
        self.checkpoint_url = checkpoint_url
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpeg-sink")
        self._pending: list[Any] = []
        self._last = -2  # the step recorded last (-2: none yet: the first record rewrites)
        self.watch: Any = None  # rpeg.runtime.degenerate.DegenerateWatch, set by _train
        self.samples_from: list[Any] | None = None  # the driver's logged samples, per step
        self._samples_seen = 0

    def record(self, ins: Any, history: dict[int, dict[str, float]]) -> None:
        import contextvars

        for f in [f for f in self._pending if f.done()]:  # a failed write fails the run here
            self._pending.remove(f)
            f.result()
        # the next step is appended; the first record of this process, or a step recomputed
        # after a recovery, rewrites the file from the history (issue 28: rewriting it on
        # every step cost 0.36 s per step at 10k steps and a copy of the history per write)
        append = ins.step == self._last + 1
        if append:
            snapshot = {ins.step: dict(history[ins.step])}
        else:
            snapshot = {s: dict(m) for s, m in history.items()}
        self._last = ins.step
        ctx = contextvars.copy_context()  # the flow run's context: its logger and artifacts
        self._pending.append(self._writer.submit(ctx.run, self._write, ins, snapshot, append))
        if self.watch is not None:  # a step that cannot move the policy: warned, then stopped
            self.watch.check(ins.step, ins.metrics)

    def _write(self, ins: Any, history: dict[int, dict[str, float]], append: bool = False) -> None:
        self.metrics.scalar(ins.step, ins.metrics)
        if append:
            self.metrics.append(history[ins.step])
        else:
            self.metrics.write_all(history)
        self.progress.update(ins.step + 1, ins.metrics)
        if ins.checkpoint is not None:
            where = self.checkpoint_url(ins.checkpoint)
            run_logger().info("checkpoint after step %d: %s", ins.checkpoint, where)
            if ins.checkpoint == self.steps:  # one artifact per run: the final checkpoint
                _artifacts("publish_checkpoint", where, ins.checkpoint)
        _artifacts("publish_step", ins.step + 1, self.steps, ins.metrics)
        got = self.samples_from
        if got is not None and len(got) > self._samples_seen:  # a logged step's samples
            from rpeg.runtime.samples import table_rows

            self._samples_seen = len(got)
            _artifacts("publish_samples", table_rows(got[-1]), got[-1][0].step)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self.progress.close()
        self.metrics.close()
        for f in self._pending:
            f.result()


def _outcome(ins: Any, fut: Any) -> Any:
    """The event of a finished task: its result, or a lost worker / out-of-memory (by the
    exception's type); any other error is raised as it is."""
    from rpeg.runtime.actors import step_messages as M
    from rpeg.runtime.actors.failures import classify

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


def _drive(run: Any, sched: Any, event: Any, sink: _Sink, hook: Any) -> Any:
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

    from rpeg.runtime.actors import step_messages as M

    finished: queue.Queue = queue.Queue()
    running: dict[Any, Any] = {}  # future -> instruction
    todo = deque(sched.handle(event))
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rpeg-unit")
    inline = Inline()
    try:
        while True:
            while todo:
                ins = todo.popleft()
                if isinstance(ins, M.Finish | M.Recover):
                    _abandon(run, running, recovering=isinstance(ins, M.Recover))
                    return ins
                if isinstance(ins, M.Fail):
                    raise ins.exception()
                if isinstance(ins, M.BeginStep):
                    run.timeline.begin_step(ins.step)
                    if hook is not None:
                        hook(run, ins.step)
                elif isinstance(ins, M.Release):
                    run.release(ins.step)
                elif isinstance(ins, M.EndStep):
                    seconds = run.timeline.end_step(ins.step)
                    todo.extend(
                        sched.handle(M.StepEnded(ins.step, seconds, run.step_metrics(ins.step)))
                    )
                elif isinstance(ins, M.Record):
                    sink.record(ins, sched.history)
                else:  # the only work in flight and nothing queued: run it in place
                    here = inline if not running and not todo else pool
                    fut = submit(run, ins, here)
                    running[fut] = ins
                    fut.add_done_callback(finished.put)
            fut = finished.get()
            todo.extend(sched.handle(_outcome(running.pop(fut), fut)))
    finally:
        pool.shutdown(wait=False)


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


def _train(
    config: RunConfig,
    *,
    cluster_address: str | None = None,
    resume: bool = False,
    summary_json: str | None = None,
    progress: bool = True,
    cluster: Any = None,
    fault_hook: Any = None,
) -> dict[str, Any]:
    """The training flow's body: set up, then execute the step scheduler's instructions;
    a lost worker is a Recover instruction, answered by re-creating the actors from the last
    checkpoint (``run.recover``) and driving on."""
    from rpeg.runtime.actors import scheduler as S
    from rpeg.runtime.actors import step_messages as M
    from rpeg.runtime.actors.driver import DistributedRun
    from rpeg.runtime.actors.failures import start_with_retries

    t_start = time.perf_counter()
    c, compiled, cl, owned = _setup(config, cluster_address, resume, cluster, progress)
    out = Path(c.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compiled_step.yaml").write_text(compiled.to_yaml())
    run = DistributedRun(c, compiled, cl)
    sched = S.StepScheduler.from_compiled(
        compiled,
        c.runtime.steps,
        checkpoint_every=c.runtime.checkpoint_every if run.store is not None else None,
        max_recoveries=c.runtime.step_retries,
    )
    from rpeg.runtime.actors.predicted import unit_memory_gib

    sched.predicted_memory_gib = unit_memory_gib(c)  # named if a unit runs out of memory
    initial = sched.state_dict()  # what a recovery before any checkpoint starts from
    sink = _Sink(out, c.runtime.steps, progress, run.checkpoint_url, c)
    from rpeg.runtime.degenerate import DegenerateWatch

    sink.watch = DegenerateWatch(c.runtime.degenerate_steps_limit)
    sink.samples_from = run.logged_samples  # samples.jsonl's rows -> a Prefect table artifact
    rlog = run_logger()
    monitor = None
    try:
        n = sum(len(g.devices) for g in compiled.actor_groups)
        _phase(
            progress,
            "starting %d actors in %d group(s); models load now",
            n,
            len(compiled.actor_groups),
        )
        start_with_retries(run, c.runtime.step_retries, warn=rlog.warning)
        monitor = _stall_monitor(run, cl, c.runtime)
        _phase(progress, "actors ready (models loaded, warmed up) in %.1f s", run.actor_start_s)
        state = run.restore() if c.runtime.resume else None
        if state is not None:
            rlog.info("resumed from checkpoint at step %d", state["step"])
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
    summary = _finish(run, sched, out, summary_json, time.perf_counter() - t_start, checksums)
    # steps run by this call (the summary's steps count the resumed run's from its start)
    summary["steps_run"] = summary["steps"] - (int(state["step"]) if state is not None else 0)
    return summary


def _stall_monitor(run: Any, cluster: Any, rt: Any) -> Any:
    """A worker that stops answering: warned about after runtime.worker_stall_warn_s, killed
    (then recovered as lost) after runtime.worker_lost_after_s (rpeg.runtime.actors.
    stall_watch); None for a cluster object that cannot ping (tests' doubles)."""
    if not hasattr(cluster, "answering"):
        return None
    from rpeg.runtime.actors.stall_watch import StallMonitor

    def held() -> dict[str, str]:
        out: dict[str, list[str]] = {}
        for (g, r), addr in dict(run.actors.placement).items():
            out.setdefault(addr, []).append(f"{g} rank {r}")
        return {a: ", ".join(v) for a, v in out.items()}

    every = min(5.0, rt.worker_stall_warn_s / 2)
    return StallMonitor(
        cluster, held, rt.worker_stall_warn_s, rt.worker_lost_after_s, every_s=every
    ).start()


def _phase(shown: bool, msg: str, *args: Any) -> None:
    """A start-up phase: the run's log, and the console when the progress is shown (the
    CLI quiets Prefect's console logs: ~16 s of start-up used to pass without a word)."""
    run_logger().info(msg, *args)
    if shown:
        print(f"start-up: {msg % args}", flush=True)


def _setup(
    config: RunConfig, cluster_address: Any, resume: bool, cluster: Any, progress: bool = False
):
    """(config, compiled step, cluster, whether we own the cluster): every input checked
    before any actor starts."""
    from rpeg.infra.cluster import start_cluster

    c = config
    if resume and not c.runtime.resume:  # the checkpoint store resolves the run to resume
        c = c.with_overrides({"runtime.resume": True})
    address = cluster_address or c.cluster.address
    rlog = run_logger()
    if address and cluster is None:
        rlog.info("connecting to the Dask scheduler at %s", address)
        cl = start_cluster(address, torch_threads=c.runtime.torch_threads, cluster_config=c.cluster)
        have = len(cl.workers)
        rlog.info("connected: %d Dask workers", have)
    else:
        cl = cluster
        have = len(cl.workers) if cl is not None else c.cluster.n_workers
    if address and c.cluster.num_devices is None:
        c = c.with_overrides({"cluster.num_devices": have})  # default plan over the whole cluster
    try:
        compiled = validate_before_start(c, cluster_devices=have if address else None)
    except Exception:
        if cl is not None and cluster is None:
            cl.close()
        raise
    owned = cluster is None  # we started the LocalCluster or connected the client
    if cl is None:
        n_workers = max(c.cluster.n_workers, compiled.num_devices)
        _phase(progress, "starting a Dask LocalCluster with %d worker processes", n_workers)
        t_cl = time.perf_counter()
        cl = start_cluster(
            None,
            n_workers=n_workers,
            threads_per_worker=c.cluster.threads_per_worker,
            torch_threads=c.runtime.torch_threads,
            cluster_config=c.cluster,
        )
        _phase(progress, "LocalCluster up in %.1f s", time.perf_counter() - t_cl)
    _check_worker_gpus(c, compiled, cl, owned)
    return c, compiled, cl, owned


def _check_worker_gpus(config: RunConfig, compiled: Any, cl: Any, owned: bool) -> None:
    """A GPU plan: the workers' own GPUs counted against it before any actor starts
    (rpeg.preflight.check_plan_devices; nvidia-smi and torch asked on every worker)."""
    from rpeg.infra.devices import cluster_device_views

    from rpeg.errors import ConfigError
    from rpeg.preflight import check_plan_devices, plan_gpus

    if not plan_gpus(compiled):
        return
    problems = check_plan_devices(config, compiled, cluster_device_views(cl.client))
    if problems:
        if owned:
            cl.close()
        raise ConfigError(problems, title="run refused before anything started")


def _finish(
    run: Any, sched: Any, out: Path, summary_json: str | None, wall_s: float, checksums: Any
) -> dict[str, Any]:
    """The summary (rpeg.runtime.summary), timeline.json and the ``_extra`` of tests."""
    from rpeg.runtime.summary import run_summary

    hist = [sched.history[s] for s in sorted(sched.history)]
    summary = run_summary(
        hist, wall_s=wall_s, acc_before=sched.acc_before, acc_after=sched.acc_after
    )
    summary.update(run.summary_extras(hist))
    timeline = {
        "records": [r.to_dict() for r in run.timeline.records],
        "step_offsets_s": run.timeline.step_offsets(),
        "stage_spans": list(run.timeline.stage_spans),
    }
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
    s = _train(
        cfg,
        cluster_address=cluster_address,
        resume=resume,
        summary_json=summary_json,
        progress=progress,
    )
    _artifacts("publish_results", s, cfg.runtime.output_dir)
    s.pop("_extra", None)
    _FINISHED[threading.get_ident()] = s  # a sync flow runs in its caller's thread
    return s


#: the summary of the flow body that returned last, by thread (run_train takes its own back
#: when Prefect could not record the flow run's final state)
_FINISHED: dict[int, dict[str, Any]] = {}


def _finished_despite_api(call: Any) -> dict[str, Any]:
    """``call()`` (a flow run); if it raises because the Prefect API stopped answering *after*
    the flow body returned, the body's summary with a warning instead: training finished and
    wrote its outputs, only the run's final state is missing from the API (the UI shows it
    Running). Measured: the ephemeral API killed mid-run; all 60 steps, the metrics and the
    summary were done, then ``error: ConnectError`` and exit 1 after ~60 s of retries."""
    from rpeg.flows.api_calls import unreachable

    me = threading.get_ident()
    _FINISHED.pop(me, None)
    try:
        return call()
    except Exception as exc:
        if me not in _FINISHED or not unreachable(exc):
            raise
        logging.getLogger("rpeg.flows.train").warning(
            "training finished, but the Prefect API stopped answering (%s: %s): this flow "
            "run's final state was not recorded",
            type(exc).__name__,
            exc,
        )
        return _FINISHED[me]
    finally:
        _FINISHED.pop(me, None)


def run_train(
    config: RunConfig,
    *,
    cluster_address: str | None = None,
    resume: bool = False,
    summary_json: str | None = None,
    progress: bool = True,
    _cluster: Any = None,
    _fault_hook: Any = None,
    _with_extra: bool = False,
) -> dict[str, Any]:
    """Run :func:`rl_train` on Prefect's ephemeral API; return the summary dict (same keys as
    the single-process trainer's). Bad input is refused before any actor starts."""
    from rpeg.runtime.datasets.fit import fit_prompt_lengths
    from rpeg.runtime.main_guard import protect_unguarded_main

    # a script without `if __name__ == "__main__":` is not re-run by the spawned workers
    protect_unguarded_main(log=print if progress else None)
    from rpeg.errors import ConfigError

    data_error = None
    try:  # the data's prompts measured once: max_prompt_tokens fits them unless set
        config = fit_prompt_lengths(config, log=print if progress else None)
    except ConfigError as exc:  # bad rows are listed with every other problem below
        data_error = exc
    # fail fast, before Prefect or Dask start; against an existing cluster the device count
    # is checked once connected (still before any actor starts)
    address = cluster_address or config.cluster.address
    validate_before_start(config, cluster_devices=10**6 if address else None)
    if data_error is not None:
        raise data_error
    if _cluster is None and _fault_hook is None and not _with_extra:
        return _finished_despite_api(
            lambda: rl_train(
                config=config.model_dump(mode="json"),
                cluster_address=cluster_address,
                resume=resume,
                summary_json=summary_json,
                progress=progress,
            )
        )

    @flow(name="train", persist_result=False, log_prints=False)
    def _inner() -> dict[str, Any]:
        s = _train(
            config,
            cluster_address=cluster_address,
            resume=resume,
            summary_json=summary_json,
            progress=progress,
            cluster=_cluster,
            fault_hook=_fault_hook,
        )
        _artifacts("publish_results", s, config.runtime.output_dir)
        return s

    s = _inner()
    if not _with_extra:
        s.pop("_extra", None)
    return s
