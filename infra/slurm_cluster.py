"""``cluster.kind: slurm``: a Dask scheduler in this process, its workers Slurm jobs.

dask-jobqueue's ``SLURMCluster`` does what it does well -- write the sbatch script, submit,
scale, cancel the jobs at close, match workers to jobs -- and is kept (docs/operating.md
argues it). Three things it does not do are added here, each through its own parameters:

* **One worker per GPU, each with its own CPUs.** A job is one node. Its worker command runs
  under ``srun --ntasks-per-node=W --cpus-per-task=C [--gpus-per-task=1]`` (jobqueue's
  ``python`` parameter), so every worker is a Slurm task with its own GPU and C cores (since
  Slurm 22.05 ``srun`` does not inherit ``--cpus-per-task``: it is given explicitly). The
  task runs :mod:`rpeg.infra.slurm_worker` (jobqueue's ``worker_command``), which names the
  worker ``<job>-<local id>`` -- the names jobqueue expects of a job with W processes -- and
  starts ``dask worker`` with a nanny. jobqueue's own ``-n 1`` / ``--cpus-per-task`` header
  lines are skipped (``job_directives_skip``) and replaced by the per-task ones.
* **Non-daemonic workers on the compute nodes.** ``distributed.worker.daemon: False`` set in
  this process does not reach them; the job script exports
  ``DASK_DISTRIBUTED__WORKER__DAEMON=False`` (:func:`worker_env`), which the nanny there reads.
* **The network.** The scheduler and the workers listen on ``cluster.interface`` only (no
  dashboard unless ``cluster.dashboard_address`` names one), ``NCCL_SOCKET_IFNAME`` and
  ``GLOO_SOCKET_IFNAME`` name the same interface, ``NCCL_NET`` the plugin
  (``cluster.nccl_net``); with ``cluster.tls_*_file`` every Dask connection is TLS.

:func:`job_kwargs` and :func:`worker_env` are pure (tested without Slurm); :func:`start`
imports dask-jobqueue (``pip install -e '.[slurm]'``).
"""

from __future__ import annotations

import math
import shlex
import sys
from typing import Any

from rpeg import defaults

#: the workers' preload (rpeg.infra.cluster.PRELOAD; this module imports nothing of it)
PRELOAD = "rpeg.runtime.actors.serializers"
WORKER_MODULE = "rpeg.infra.slurm_worker"
#: the variable that makes the nodes' workers non-daemonic (their nanny reads it at start)
DAEMON_VAR = "DASK_DISTRIBUTED__WORKER__DAEMON"


def workers_and_nodes(cc: Any, n_workers: int) -> tuple[int, int]:
    """(workers per node, nodes) for ``n_workers`` ranks' workers: ``cluster.slurm.nodes``
    or as many nodes as they need."""
    per = cc.slurm.per_node
    nodes = cc.slurm.nodes or max(1, math.ceil(n_workers / per))
    return per, nodes


def worker_env(cc: Any, torch_threads: int = defaults.TORCH_THREADS) -> dict[str, str]:
    """The environment every Slurm worker gets (exported by the job script, inherited by
    ``srun``'s tasks and the nanny's worker process)."""
    from rpeg.infra.network import collective_env

    env = {
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        DAEMON_VAR: "False",
        "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
        "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
        "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False",
        "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "error",
        # Dask's MALLOC_TRIM_THRESHOLD_ slows torch CPU ops (rpeg.infra.cluster.worker_environ)
        "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": "{'MALLOC_TRIM_THRESHOLD_': None}",
        "OMP_NUM_THREADS": str(torch_threads),
        "MKL_NUM_THREADS": str(torch_threads),
        # rpeg.infra.slurm_worker names the job's workers <job>-<local id> when several
        "RPEG_SLURM_WORKERS_PER_NODE": str(cc.slurm.per_node),
    }
    env.update(collective_env(cc))
    return env


def security(cc: Any) -> Any:
    """Dask ``Security`` for every role (scheduler, workers, this client) from
    ``cluster.tls_*_file``; None without them. The files must be readable on the compute
    nodes at the same paths (a shared file system)."""
    files = (cc.tls_ca_file, cc.tls_cert_file, cc.tls_key_file)
    if not any(files):
        return None
    if not all(files):
        from rpeg.errors import ConfigError, Problem

        raise ConfigError(
            [
                Problem(f"cluster.{k}", "needed: TLS takes a CA, a certificate and a key")
                for k, v in zip(
                    ("tls_ca_file", "tls_cert_file", "tls_key_file"), files, strict=True
                )
                if not v
            ],
            title="TLS settings incomplete",
        )
    from distributed.security import Security

    ca, cert, key = files
    return Security(
        tls_ca_file=ca,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        tls_client_cert=cert,
        tls_client_key=key,
        require_encryption=True,
    )


def srun_prefix(cc: Any, per_node: int) -> str:
    """The ``srun`` that starts a job's workers: one task per worker, its CPUs explicit,
    one GPU each when the nodes have GPUs."""
    s = cc.slurm
    parts = [
        "srun",
        f"--ntasks-per-node={per_node}",
        f"--cpus-per-task={s.cpus_per_worker}",
        "--cpu-bind=cores",
        "--kill-on-bad-exit=0",
    ]
    if s.gpus_per_node:
        parts.append("--gpus-per-task=1")
    return " ".join(parts)


def job_kwargs(
    cc: Any,
    n_workers: int,
    torch_threads: int = defaults.TORCH_THREADS,
    python: str | None = None,
    sec: Any = None,
) -> dict[str, Any]:
    """``SLURMCluster`` keyword arguments for ``cluster`` (a :class:`rpeg.config.ClusterConfig`
    of kind slurm) and ``n_workers`` ranks' workers (pure: no dask-jobqueue needed)."""
    s = cc.slurm
    per, _ = workers_and_nodes(cc, n_workers)
    python = python or s.python or shlex.quote(sys.executable)  # s.python: a shell word ($HOME)
    directives = [
        "--nodes=1",
        f"--ntasks-per-node={per}",
        f"--cpus-per-task={s.cpus_per_worker}",
    ]
    if s.gpus_per_node:
        directives.append(f"--gpus-per-node={s.gpus_per_node}")
    directives += list(s.extra_directives)
    prologue = [f"export {k}={shlex.quote(v)}" for k, v in worker_env(cc, torch_threads).items()]
    prologue += list(s.prologue)
    scheduler_options: dict[str, Any] = {"interface": cc.interface}
    if cc.dashboard_address:
        scheduler_options["dashboard_address"] = cc.dashboard_address
    else:
        # the scheduler's HTTP server (health, metrics) still runs: on loopback
        scheduler_options["dashboard"] = False
        scheduler_options["dashboard_address"] = "127.0.0.1:0"
    kw: dict[str, Any] = {
        "queue": s.partition,
        "account": s.account,
        "job_name": s.job_name,
        "walltime": s.time,
        "cores": per,  # one thread per worker (the actor's); its CPUs are srun's
        "processes": per,
        "memory": _job_memory(s.memory_per_worker, per),
        # no --mem line without memory_per_worker (skipped below; jobqueue cannot format 0)
        "job_mem": None if s.memory_per_worker else "0",
        "interface": cc.interface,
        "python": f"{srun_prefix(cc, per)} {python}",
        "worker_command": WORKER_MODULE,
        "worker_extra_args": [
            "--resources",
            "device=1",
            "--preload",
            PRELOAD,
            "--no-dashboard",
        ],
        "job_directives_skip": [
            "-n 1",
            "--cpus-per-task",
            *([] if s.memory_per_worker else ["--mem"]),
        ],
        "job_extra_directives": directives,
        "job_script_prologue": prologue,
        "scheduler_options": scheduler_options,
        "log_directory": s.log_directory,
        "death_timeout": 120,
    }
    if sec is not None:
        kw["security"] = sec
        kw["protocol"] = "tls://"
    return {k: v for k, v in kw.items() if v is not None}


def _job_memory(per_worker: str | None, per: int) -> str:
    """A job's memory: per-worker x workers (jobqueue splits it back); "0" = no limit."""
    if not per_worker:
        return "0"
    from dask.utils import format_bytes, parse_bytes

    return format_bytes(parse_bytes(per_worker) * per).replace(" ", "")


def start(
    cc: Any,
    n_workers: int,
    torch_threads: int = defaults.TORCH_THREADS,
    direct_to_workers: bool = True,
):
    """Start the scheduler here and the jobs of ``n_workers`` workers; wait until they all
    joined (``cluster.slurm.start_timeout_s``). Returns (client, SLURMCluster): closing the
    SLURMCluster cancels the jobs (rpeg.infra.cluster.start_cluster wraps both)."""
    import time

    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        from rpeg.errors import ConfigError, Problem

        raise ConfigError(
            [Problem("cluster.kind", "slurm needs dask-jobqueue: pip install -e '.[slurm]'")]
        ) from None
    from distributed import Client
    from rpeg.infra.interrupts import services_ignore_sigint

    from rpeg.runtime.actors import serializers

    sec = security(cc)
    per, nodes = workers_and_nodes(cc, n_workers)
    kw = job_kwargs(cc, n_workers, torch_threads, sec=sec)
    with services_ignore_sigint():
        jq = SLURMCluster(**kw)
    try:
        jq.scale(jobs=nodes)
        client = Client(jq, set_as_default=False, security=sec, direct_to_workers=direct_to_workers)
        want = per * nodes
        deadline = time.monotonic() + cc.slurm.start_timeout_s
        while len(client.scheduler_info(n_workers=-1)["workers"]) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(client.scheduler_info(n_workers=-1)['workers'])} of {want} Slurm "
                    f"workers joined within cluster.slurm.start_timeout_s="
                    f"{cc.slurm.start_timeout_s:.0f} s; jobs {job_ids(jq)}: {_queue_state(jq)}"
                )
            time.sleep(0.5)
        client.run(serializers.register)
    except BaseException:
        jq.close()
        raise
    return client, jq


def job_ids(jq: Any) -> list[str]:
    """The Slurm job ids of a SLURMCluster's jobs (submitted ones)."""
    return sorted(
        str(j.job_id) for j in getattr(jq, "workers", {}).values() if getattr(j, "job_id", None)
    )


def _queue_state(jq: Any) -> str:
    """``squeue``'s state and reason of the jobs (why they are not running)."""
    import subprocess

    ids = job_ids(jq)
    if not ids:
        return "no job submitted"
    try:
        r = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T %R"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"squeue failed: {e}"
    return (r.stdout.strip() or r.stderr.strip() or "not in the queue").replace("\n", "; ")
