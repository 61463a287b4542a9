"""The ``rl_train`` Prefect flow and its Python entry :func:`run_train`.

Prefect drives, Dask executes: the flow compiles the plan, validates everything (devices,
roles, checkpoint URL) *before* any actor starts, brings up the cluster, starts one actor
per rank, then runs the step loop with one thin task per execution unit. Synchronous or
colocated layouts run each step's units in dependency order (units on disjoint devices
concurrently); layouts with a separate rollout group pipeline rollouts through the
staleness buffer, at most k versions ahead of training, with a bucketed weight sync after
every update. A lost worker fails the step; the flow re-creates the actors from the last
checkpoint and continues (no step counted twice, no sample lost or used twice).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow  # noqa: E402

from rpeg.config import RunConfig  # noqa: E402

log = logging.getLogger("rpeg.flows.train")

SUMMARY_KEYS = (
    "steps",
    "wall_s",
    "median_step_s",
    "reward_first10",
    "reward_last10",
    "heldout_acc_before",
    "heldout_acc_after",
)


def _is_worker_loss(exc: BaseException) -> bool:
    """A lost worker or actor (retry from the checkpoint), not a bug in a stage (re-raise)."""
    if isinstance(exc, OSError | ConnectionError | TimeoutError):
        return (
            True  # distributed's CommClosedError is an OSError ("Unable to contact Actor's worker")
        )
    text = f"{type(exc).__name__}: {exc}"
    keys = (
        "Unable to contact",
        "KilledWorker",
        "lost",
        "CommClosed",
        "KilledWorker",
        "StreamClosed",
        "not found",
        "closed",
        "Connection",
        "Timeout",
    )
    return any(k in text for k in keys)


def validate_before_start(config: RunConfig, cluster_devices: int | None = None):
    """Compile and check every input; raises ConfigError listing all problems."""
    from rpeg.compile import compile_plan
    from rpeg.runtime.actors.checkpoint import check_writable

    compiled = compile_plan(None, config, cluster_devices=cluster_devices)
    if config.runtime.checkpoint_url:
        check_writable(config.runtime.checkpoint_url)
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


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        self.p = None
        if enabled:
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
            )
            self.t = self.p.add_task("rl", total=total, reward=0.0, tps=0.0)
            self.p.start()

    def update(self, done: int, m: dict[str, float]) -> None:
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
    """metrics.jsonl (+ TensorBoard when installed); a rewritten step replaces its line."""

    def __init__(self, out: Path):
        self.path = out / "metrics.jsonl"
        self.tb = None
        try:  # optional
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tb"))
        except Exception:  # noqa: BLE001
            self.tb = None

    def write_all(self, metrics: dict[int, dict[str, float]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            for s in sorted(metrics):
                fh.write(json.dumps(metrics[s]) + "\n")
        os.replace(tmp, self.path)

    def scalar(self, step: int, m: dict[str, float]) -> None:
        if self.tb is not None:
            for k, v in m.items():
                if isinstance(v, int | float):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


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
    from rpeg.infra.cluster import start_cluster
    from rpeg.tasks import (
        checkpoint_task,
        evaluate_task,
        rollout_task,
        run_unit_task,
        sync_weights_task,
        take_task,
    )

    from rpeg.runtime.actors.driver import DistributedRun

    t_start = time.perf_counter()
    c = config
    address = cluster_address or c.cluster.address
    if address and cluster is None:
        cl = start_cluster(address, torch_threads=c.runtime.torch_threads)
        have = len(cl.workers)
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
        cl = start_cluster(
            None,
            n_workers=max(c.cluster.n_workers, compiled.num_devices),
            threads_per_worker=c.cluster.threads_per_worker,
            torch_threads=c.runtime.torch_threads,
        )
    out = Path(c.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compiled_step.yaml").write_text(compiled.to_yaml())
    run = DistributedRun(c, compiled, cl)
    metrics_out = _Metrics(out)
    prog = _Progress(c.runtime.steps, progress)
    retries = c.runtime.step_retries
    recoveries = 0
    timeout = c.runtime.buffer_timeout_s
    try:
        run.start_actors()
        if resume or c.runtime.resume:
            got = run.restore()
            if got is not None:
                log.info("resumed from checkpoint at step %d", got)
        run.sync_at_start()
        acc_before = run.metrics.get(-1, {}).get("heldout_acc_before")
        if acc_before is None:
            acc_before = evaluate_task(run)
            run.metrics[-1] = {"heldout_acc_before": acc_before}
        steps = c.runtime.steps
        roll_futs: list[Any] = []
        next_roll = run.step
        while run.step < steps:
            step = run.step
            t0 = time.perf_counter()
            try:
                if fault_hook is not None:
                    fault_hook(run, step)
                futs: dict[str, Any] = {}
                m: dict[str, float] = {"step": float(step)}
                if run.async_rollout:
                    while next_roll <= min(step + run.k, steps - 1):
                        prev = roll_futs[-1:] if roll_futs else []
                        roll_futs.append(rollout_task.submit(run, timeout, wait_for=prev))
                        next_roll += 1
                    take = take_task.submit(run, step, timeout)
                    for t in compiled.tasks_in("train"):
                        if "sync_weights" in t.kinds:
                            continue
                        wait = [futs[d] for d in t.depends_on + t.after if d in futs] or [take]
                        futs[t.name] = run_unit_task.submit(run, step, t.name, wait_for=wait)
                    m.update(take.result())
                    for f in futs.values():
                        m.update(f.result())
                    run.publish(step + 1)
                    m.update(sync_weights_task.submit(run, step).result())
                    m.update(run.metrics.get(step, {}))
                else:
                    for t in compiled.tasks:
                        wait = [futs[d] for d in t.depends_on + t.after if d in futs]
                        futs[t.name] = run_unit_task.submit(run, step, t.name, wait_for=wait)
                    for f in futs.values():
                        m.update(f.result())
                    run.call(compiled.trainer_group, "drop", step)
                    run.slot_examples.pop(step, None)
                m["step_s"] = time.perf_counter() - t0
                m["tokens_per_s"] = m.get("num_tokens", 0.0) / max(m["step_s"], 1e-9)
                run.metrics[step] = m
                run.step = step + 1
                if run.store is not None and (
                    run.step % c.runtime.checkpoint_every == 0 or run.step == steps
                ):
                    m.update(checkpoint_task.submit(run, run.step).result())
                    _artifacts(
                        "publish_checkpoint", f"{run.store.url}/step-{run.step:08d}", run.step
                    )
            except Exception as exc:
                if run.store is None or recoveries >= retries or not _is_worker_loss(exc):
                    raise
                recoveries += 1
                log.warning("step %d failed (%s); recovering from the last checkpoint", step, exc)
                _recover(run, roll_futs)
                roll_futs, next_roll = [], run.step
                continue
            metrics_out.scalar(step, m)
            metrics_out.write_all({s: v for s, v in run.metrics.items() if s >= 0})
            prog.update(run.step, m)
            _artifacts("publish_step", run.step, steps, m)
        acc_after = evaluate_task(run)
        checksums = run.call(compiled.trainer_group, "param_checksum")
    finally:
        prog.close()
        metrics_out.close()
        run.queue.close()
        run.close()
        if owned:
            cl.close()
    hist = [run.metrics[s] for s in sorted(run.metrics) if s >= 0]
    rewards = [h.get("reward_mean", 0.0) for h in hist]
    summary: dict[str, Any] = {
        "steps": len(hist),
        "wall_s": time.perf_counter() - t_start,
        "median_step_s": statistics.median(h["step_s"] for h in hist) if hist else 0.0,
        "reward_first10": sum(rewards[:10]) / max(len(rewards[:10]), 1),
        "reward_last10": sum(rewards[-10:]) / max(len(rewards[-10:]), 1),
        "heldout_acc_before": acc_before,
        "heldout_acc_after": acc_after,
    }
    extra = {
        "recoveries": recoveries,
        "param_checksums": checksums,
        "actor_start_s": getattr(run, "actor_start_s", 0.0),
        "timeline": [r.to_dict() for r in run.timeline.records],
        "step_offsets_s": {s: t - run.timeline.origin for s, t in run.timeline._step_start.items()},
        "stage_spans": list(run.timeline.stage_spans),
        "weight_sync": run.sync_log,
        "history": hist,
    }
    with open(out / "timeline.json", "w") as fh:
        json.dump(
            {
                "records": extra["timeline"],
                "step_offsets_s": extra["step_offsets_s"],
                "stage_spans": extra["stage_spans"],
            },
            fh,
        )
    _artifacts("publish_metrics_table", hist)
    _artifacts("publish_summary", summary)
    if summary_json:
        Path(summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(summary_json).write_text(json.dumps(summary, indent=1))
    summary["_extra"] = extra
    return summary


def _recover(run: Any, roll_futs: list[Any]) -> None:
    """Roll back to the last checkpoint after a lost worker (see ``DistributedRun.recover``).

    In-flight rollout tasks are unblocked (buffer closed) and awaited first, so none of
    them writes into the restored state."""
    import contextlib

    run.queue.close()
    for f in roll_futs:
        with contextlib.suppress(Exception):
            f.wait(timeout=120)
    run.recover()


@flow(name="rl_train", persist_result=False, log_prints=False, validate_parameters=True)
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
    s.pop("_extra", None)
    return s


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
    # fail fast, before Prefect or Dask start; against an existing cluster the device count
    # is checked once connected (still before any actor starts)
    address = cluster_address or config.cluster.address
    validate_before_start(config, cluster_devices=10**6 if address else None)
    if _cluster is None and _fault_hook is None and not _with_extra:
        return rl_train(
            config=config.model_dump(mode="json"),
            cluster_address=cluster_address,
            resume=resume,
            summary_json=summary_json,
            progress=progress,
        )

    @flow(name="rl_train", persist_result=False, log_prints=False)
    def _inner() -> dict[str, Any]:
        return _train(
            config,
            cluster_address=cluster_address,
            resume=resume,
            summary_json=summary_json,
            progress=progress,
            cluster=_cluster,
            fault_hook=_fault_hook,
        )

    s = _inner()
    if not _with_extra:
        s.pop("_extra", None)
    return s
