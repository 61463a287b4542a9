"""What the training flow does before any actor starts (:func:`setup_run`): compile and check
every input (:func:`validate_before_start`), connect to or start the Dask cluster, count the
workers' GPUs against the plan; and the stall monitor and start-up messages of
:mod:`rpeg.flows.train`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from rpeg.flows.launch import run_logger

from rpeg.config import RunConfig

#: a compiled step already checked for a config, handed from :func:`rpeg.flows.train.train`
#: (which checks before Prefect starts: fail fast) to the ``rl_train`` flow body it starts in
#: the same call, so that the run compiles once. A context variable set for that call only
#: (:func:`checked_step`): nothing outlives the call, and a flow started from the UI or a
#: deployment has nothing handed and checks for itself.
_CHECKED: ContextVar[tuple[str, Any] | None] = ContextVar("rpeg_checked_step", default=None)


@contextmanager
def checked_step(config: RunConfig, compiled: Any) -> Iterator[None]:
    """Inside the block, :func:`handed_step` of the same config answers ``compiled``."""
    token = _CHECKED.set((config.model_dump_json(), compiled))
    try:
        yield
    finally:
        _CHECKED.reset(token)


def handed_step(config: RunConfig) -> Any:
    """The compiled step :func:`checked_step` handed for this very config (its JSON
    compared: ``rl_train`` rebuilds the config from its parameters), else None."""
    given = _CHECKED.get()
    if given is None or given[0] != config.model_dump_json():
        return None
    return given[1]


def validate_before_start(config: RunConfig, cluster_devices: int | None = None):
    """Compile and check every input (model, task data, rewards, template, places, machine,
    the plan and the engine, all at once); raises ConfigError listing all problems."""
    from rpeg.preflight import preflight
    from rpeg.runtime.engines.choice import check_engine

    compiled = preflight(config, cluster_devices=cluster_devices)
    check_engine(config, compiled)
    return compiled


def warm_up_before_ranks(
    config: RunConfig, compiled: Any, log: Any = None, progress: bool = False
) -> bool:
    """The distributed run's SFT warm-up in the driver, before any rank starts, when the
    ranks run on CPU: its progress reaches the console and the ranks read the cached result
    (rpeg.runtime.warmup; a GPU rank warms up where it runs, one rank computing under the
    cache entry's lock). True when it ran or found the entry cached."""
    if not config.warmup_sft_steps:
        return False
    if any(g.device_type != "cpu" for g in compiled.actor_groups):
        return False
    from rpeg.runtime.role_builder import build_policy

    startup_phase(
        progress,
        "SFT warm-up of the policy (%d steps, once for all ranks; cached for later runs)",
        config.warmup_sft_steps,
    )
    build_policy(config, log=log)
    return True


def stall_monitor(run: Any, cluster: Any, rt: Any) -> Any:
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


def startup_phase(shown: bool, msg: str, *args: Any) -> None:
    """A start-up phase: the run's log, and the console when the progress is shown (the
    CLI quiets Prefect's console logs: ~16 s of start-up used to pass without a word)."""
    run_logger().info(msg, *args)
    if shown:  # through the start-up ticker: it repeats the phase while nothing is printed
        from rpeg.runtime.progress import announce

        announce(f"start-up: {msg % args}", label=msg % args)


def setup_run(
    config: RunConfig,
    cluster_address: Any,
    resume: bool,
    cluster: Any,
    progress: bool = False,
    checked: Any = None,
):
    """(config, compiled step, cluster, whether we own the cluster): every input checked
    before any actor starts. ``checked``: the step compiled and checked for ``config`` before
    (rpeg.preflight.prepare), taken as it is when nothing below changes the config and no
    existing cluster's devices must be counted against it."""
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
        if checked is not None and c is config and not address:
            compiled = checked
        else:
            compiled = validate_before_start(c, cluster_devices=have if address else None)
    except Exception:
        if cl is not None and cluster is None:
            cl.close()
        raise
    owned = cluster is None  # we started the LocalCluster or connected the client
    if cl is None:
        n_workers = max(c.cluster.n_workers, compiled.num_devices)
        startup_phase(progress, "starting a Dask LocalCluster with %d worker processes", n_workers)
        t_cl = time.perf_counter()
        cl = start_cluster(
            None,
            n_workers=n_workers,
            threads_per_worker=c.cluster.threads_per_worker,
            torch_threads=c.runtime.torch_threads,
            cluster_config=c.cluster,
        )
        startup_phase(progress, "LocalCluster up in %.1f s", time.perf_counter() - t_cl)
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
