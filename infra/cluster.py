"""Dask bring-up for the runtime.

* :func:`start_cluster` starts a ``LocalCluster`` (one worker process per device, one thread
  each, non-daemon so DataLoader workers work) or attaches to ``tcp://host:8786``.
* Every worker gets ``resources={"device": 1}`` (LocalCluster; pass ``--resources device=1``
  to ``dask worker``) and ``OMP/MKL_NUM_THREADS`` = ``torch_threads``; the rank claims its
  torch threads on the thread that runs it and the worker's other threads run torch at one
  (rpeg.runtime.compute_thread). Dask's default ``MALLOC_TRIM_THRESHOLD_`` is unset in
  the workers (``worker_environ``: it makes torch CPU ops ~1.4x slower).
* The bf16-safe tensor serializer is registered in the client and, through a preload
  (``rpeg.runtime.actors.serializers``, whose hook also sets the worker's own threads to one
  torch thread), in every worker.
* Everything listens on loopback: the scheduler and workers on 127.0.0.1, no dashboard
  unless ``cluster.dashboard_address`` names one (``dashboard=True``: 127.0.0.1, free port).
  A ``tls://`` scheduler is reached with Dask's ``Security`` (``cluster.tls_*_file``).
* The worker memory limit is ``cluster.worker_memory`` (default ``auto``: the machine's
  memory split over the workers), not a constant.
* ``cluster.device_type: cuda`` starts dask-cuda's ``LocalCUDACluster``: one worker per GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from rpeg.infra.network import collective_env

from rpeg import defaults

PRELOAD = "rpeg.runtime.actors.serializers"
LOST_WORKER_TIMEOUT = "600s"  # configure_dask says why


def prefect_env() -> None:
    """No telemetry, quiet ephemeral server (set before prefect is imported)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def worker_environ(torch_threads: int = defaults.TORCH_THREADS) -> dict[str, Any]:
    """Environment a Nanny sets before it spawns a worker process.

    Dask's default (``distributed.nanny.pre-spawn-environ``) includes
    ``MALLOC_TRIM_THRESHOLD_=65536``. Setting any glibc trim/mmap threshold turns off glibc's
    dynamic mmap threshold (mallopt(3), M_MMAP_THRESHOLD), so every allocation >= 128 KiB is a
    fresh mmap + page faults + munmap. PyTorch allocates such tensors on every op: measured here,
    a 256x256 @ 256x1024 fp32 matmul takes 2.05 ms with the variable vs 1.47 ms without, and the
    built-in run's stages take 1.7-1.9x longer in a Dask actor than in one process
    (docs/measurements.md). The variable is unset unless the user's own environment sets it.
    """
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    if "MALLOC_TRIM_THRESHOLD_" in os.environ:
        env["MALLOC_TRIM_THRESHOLD_"] = os.environ["MALLOC_TRIM_THRESHOLD_"]
    else:
        env["MALLOC_TRIM_THRESHOLD_"] = None  # None unsets it (distributed.nanny)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = torch_threads
    return env


def configure_dask(torch_threads: int = defaults.TORCH_THREADS, *, profile: bool = False) -> None:
    """Dask settings of the run's LocalCluster (workers inherit them). ``profile``: keep the
    workers' sampling profiler (``distributed.worker.profile``: every 10 ms, on the worker's
    event-loop thread, it walks every thread's Python stack), which only the dashboard shows.
    Off, a rank of ``configs/sharded-cpu.yaml`` on the 2-core machine spent 3.8% instead of
    9.6% of its CPU time on that thread (``perf``), and the step took 0.887 s instead of 1.020
    s (median, 12 steps x 2 interleaved runs each)."""
    import dask

    dask.config.set(
        {
            "distributed.nanny.pre-spawn-environ": worker_environ(torch_threads),
            "distributed.worker.daemon": False,
            "distributed.worker.preload": [PRELOAD],
            "distributed.scheduler.work-stealing": False,
            "distributed.admin.tick.limit": "30s",
            # the event-loop health check (20 ms) and the dashboard's system monitor (500 ms)
            # woke every server's loop: idle, the flow process's loop (scheduler, nannies,
            # client) took 3.0% of a core and the two workers 2.6%; at 500 ms / 2 s: 0.7% and
            # 1.2% (benchmarks/bench_overhead.py, docs/measurements.md 2026-12-05)
            "distributed.admin.tick.interval": "500ms",
            "distributed.admin.system-monitor.interval": "2s",
            "distributed.comm.timeouts.connect": "10s",
            # how long a LocalCluster keeps the nanny of a worker that left the scheduler:
            # past it the nanny is closed for good. The nanny restarts a killed worker at
            # once, but the new process registers only after its imports (torch): 5-20 s on
            # a loaded 2-core machine. At "5s" every replacement that took longer was
            # closed -- issue 28's "1 of 1 listed workers answer, 4 expected" at k=1. The
            # run's recovery has its own deadline (rpeg.runtime.step.recovery).
            "distributed.deploy.lost-worker-timeout": LOST_WORKER_TIMEOUT,
            "distributed.scheduler.allowed-failures": 0,
            "distributed.worker.memory.terminate": False,
            "distributed.logging.distributed": "error",
            "distributed.worker.profile.enabled": profile,
        }
    )
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(torch_threads)


async def _end_process() -> None:
    """Run on a worker's event loop (``client.run(..., wait=False)`` takes coroutines only):
    the process exits at once, as a ``kill -9`` would end it."""
    os._exit(137)


def _kill_worker_process(dask_worker: Any) -> int:
    """Run on a nanny (``client.run(..., nanny=True)``): SIGKILL its worker process."""
    import signal

    pid = dask_worker.pid
    if pid:
        os.kill(pid, signal.SIGKILL)
    return int(pid or 0)


#: where a LocalCluster's workers make their rendezvous stores (rpeg.runtime.actors.rendezvous:
#: a FileStore folder per process group); every distributed run left a /tmp/rpeg-store-*
#: folder behind (111 on one machine), now they sit in one folder the cluster removes
STORE_DIR_ENV = "RPEG_STORE_DIR"


@dataclass
class Cluster:
    """A Dask client plus (for local runs) the LocalCluster it owns."""

    client: Any
    local: Any = None
    address: str = ""
    owned: bool = True
    #: the folder of this LocalCluster's rendezvous stores (:data:`STORE_DIR_ENV`), removed
    #: by :meth:`close`
    store_dir: str | None = None
    _closed: bool = field(default=False, repr=False)

    #: "local" (a LocalCluster or an existing scheduler) or "slurm" (rpeg.infra.slurm_cluster)
    kind: str = "local"
    #: what each worker said about itself (:func:`worker_facts`), by worker name; kept for the
    #: run summary of a Slurm cluster (its job ids), refreshed when the workers change
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    _facts_of: frozenset = field(default=frozenset(), repr=False)

    @property
    def workers(self) -> list[str]:
        """The addresses of the workers that declare a ``device`` resource (every worker when
        none does: workers started without ``--resources device=1``), ordered by node, then
        by name with numbers compared as numbers (:func:`placement_order`): device i of a
        plan is the i-th, so consecutive devices -- a tensor-parallel group -- share a node."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        addrs = placement_order(info)
        if self.kind == "slurm" and addrs and frozenset(addrs) != self._facts_of:
            self._record_facts(addrs)
        return addrs

    def _record_facts(self, addrs: list[str]) -> None:
        with contextlib.suppress(Exception):
            res = self.client.run(worker_facts, workers=addrs, on_error="return")
            self.facts = {
                str(f["name"]): f for f in (res.get(a) for a in addrs) if isinstance(f, dict)
            }
            self._facts_of = frozenset(addrs)

    def summary_fields(self) -> dict[str, Any]:
        """Run-summary fields of the cluster: for a Slurm cluster its workers' job ids
        (``slurm_job_ids``) and what each worker reported, in placement order (``workers``:
        node, local id, daemon or not, the collectives' interface variables); {} otherwise."""
        if self.kind != "slurm":
            return {}
        ids = sorted({f["slurm_job_id"] for f in self.facts.values() if f.get("slurm_job_id")})
        return {"slurm_job_ids": ids, "workers": list(self.facts.values())}

    def live_workers(self, expect: int, timeout_s: float = 90.0, min_ok: int = 1) -> list[str]:
        """Wait until the scheduler lists no dead worker and at least ``expect`` workers answer.

        After a worker process dies the scheduler keeps listing its address until it notices
        the closed comm, and the nanny registers the replacement under the same name but a new
        address. This polls ``scheduler_info`` and pings every listed worker; it returns the
        sorted addresses once all of them answer and there are ``expect`` of them (or, at the
        deadline, at least ``min_ok`` answering ones), else raises ``TimeoutError``.
        """
        import time

        deadline = time.monotonic() + timeout_s
        last: list[str] = []
        while True:
            addrs = self.workers
            ok = []
            if addrs:
                res = self.client.run(os.getpid, workers=addrs, on_error="return")
                ok = [a for a in addrs if isinstance(res.get(a), int)]
            if ok and len(ok) == len(addrs) and len(ok) >= expect:
                return addrs
            last = ok
            if time.monotonic() > deadline:
                if len(ok) >= min_ok and len(ok) == len(addrs):
                    return addrs
                raise TimeoutError(
                    f"cluster not healthy after {timeout_s:.0f}s: {len(ok)} of {len(addrs)} "
                    f"listed workers answer, {expect} expected"
                )
            time.sleep(0.25 if last else 0.5)

    def answering(self, addrs: list[str], timeout_s: float = 15.0) -> set[str]:
        """Those of ``addrs`` that answer a ping within ``timeout_s`` (a killed worker the
        scheduler still lists fails at once; a stopped one never answers: the ping is
        abandoned after ``timeout_s``)."""
        from concurrent.futures import ThreadPoolExecutor, wait

        if not addrs:
            return set()
        pool = ThreadPoolExecutor(len(addrs), thread_name_prefix="rpeg-ping")
        futs = {
            a: pool.submit(self.client.run, os.getpid, workers=[a], on_error="return")
            for a in addrs
        }
        wait(list(futs.values()), timeout=timeout_s)
        pool.shutdown(wait=False)
        ok = set()
        for a, f in futs.items():
            if f.done() and f.exception() is None and isinstance(f.result().get(a), int):
                ok.add(a)
        return ok

    def end_processes(self, addrs: list[str]) -> None:
        """End these workers' processes at once (``os._exit``, run on each worker's event
        loop, which answers even while its actor thread is blocked in a collective); their
        nannies start fresh ones (rpeg.runtime.step.recovery says why not
        ``restart_workers``)."""
        with contextlib.suppress(Exception):
            self.client.run(_end_process, workers=list(addrs), wait=False)

    def kill_from_nanny(self, addrs: list[str]) -> None:
        """SIGKILL these workers' processes from their nannies (a stopped or hung process
        cannot run ``end_processes``' function; the nanny then starts a fresh one)."""
        with contextlib.suppress(Exception):
            self.client.run(_kill_worker_process, workers=list(addrs), nanny=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)
        if self.local is not None:
            with contextlib.suppress(Exception):
                self.local.close(timeout=10)
        if self.store_dir:  # the workers' rpeg-store-* folders (success or failure alike)
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _natural(text: str) -> tuple:
    """A sort key comparing the numbers in ``text`` as numbers: rank-2 before rank-10."""
    import re

    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", text)
        if part
    )


def placement_order(info: dict[str, dict[str, Any]]) -> list[str]:
    """Worker addresses for placement from ``scheduler_info()["workers"]``: only workers with
    a ``device`` resource when any has one; ordered by name, numbers as numbers
    (``0-2`` < ``0-10`` < ``1-0``), then grouped by host in the order hosts first appear, so
    that one node's workers are consecutive -- (node, local GPU) order for Slurm's
    ``<job>-<local id>`` names, ``rank-<procid>`` names and dask-cuda's numbered ones."""
    devices = {a: w for a, w in info.items() if (w.get("resources") or {}).get("device", 0) >= 1}
    pool = devices or info
    by_name = sorted(pool, key=lambda a: (_natural(str(pool[a].get("name"))), _natural(a)))
    hosts: dict[str, list[str]] = {}
    for a in by_name:
        hosts.setdefault(
            str(pool[a].get("host") or a.split("://")[-1].rsplit(":", 1)[0]), []
        ).append(a)
    return [a for group in hosts.values() for a in group]


def worker_facts(dask_worker: Any = None) -> dict[str, Any]:
    """Run on a worker (``client.run`` passes ``dask_worker``): its name, node, Slurm job and
    local id, whether its process is a daemon, and the collectives' network variables."""
    import multiprocessing
    import socket

    w = dask_worker
    env = os.environ
    return {
        "name": w.name,
        "address": w.address,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "daemon": multiprocessing.current_process().daemon,
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "slurm_node": env.get("SLURMD_NODENAME"),
        "slurm_localid": env.get("SLURM_LOCALID"),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "env": {
            k: env[k]
            for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_NET", "OMP_NUM_THREADS")
            if k in env
        },
    }


def _env_plugin(env: dict[str, str]):
    """A worker plugin that sets ``env`` in every worker process, those that join later
    included (before any actor creates a process group: NCCL and gloo read them then)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class _CollectiveEnv(WorkerPlugin):
        name = "rpeg-collective-env"

        def __init__(self, values: dict[str, str]):
            self.values = dict(values)

        def setup(self, worker):
            os.environ.update(self.values)

    return _CollectiveEnv(env)


def listens_on_all_interfaces(address: str) -> bool:
    """``":8787"``, ``"8787"``, ``"0.0.0.0:8787"``, ``"[::]:8787"``: a server bound there
    accepts connections on every interface."""
    host = address.rpartition(":")[0] if ":" in address else ""
    host = host.split("://")[-1].strip("[]")
    return host in ("", "0.0.0.0", "::", "*")


def security_for(cluster_config: Any = None, address: str | None = None) -> Any:
    """Dask ``Security`` for a ``tls://`` scheduler (``cluster.tls_*_file``); None otherwise.

    A ``tls://`` address without a CA, certificate and key is refused (the preflight reports
    it first, naming the fields)."""
    if not (address or "").startswith("tls://"):
        return None
    cc = cluster_config
    files = {
        "cluster.tls_ca_file": getattr(cc, "tls_ca_file", None),
        "cluster.tls_cert_file": getattr(cc, "tls_cert_file", None),
        "cluster.tls_key_file": getattr(cc, "tls_key_file", None),
    }
    missing = [k for k, v in files.items() if not v]
    if missing:
        from rpeg.errors import ConfigError, Problem

        raise ConfigError(
            [Problem(k, f"needed for the tls:// scheduler {address}") for k in missing],
            title="TLS settings missing",
        )
    from distributed.security import Security

    return Security(
        tls_ca_file=files["cluster.tls_ca_file"],
        tls_client_cert=files["cluster.tls_cert_file"],
        tls_client_key=files["cluster.tls_key_file"],
        require_encryption=True,
    )


def cuda_device_count() -> int:
    """CUDA devices visible to this process (0 without torch or CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch / no driver: no GPUs
        return 0


def start_cluster(
    address: str | None = None,
    *,
    n_workers: int = defaults.N_WORKERS,
    threads_per_worker: int = defaults.THREADS_PER_WORKER,
    torch_threads: int = defaults.TORCH_THREADS,
    memory_limit: str | int | None = None,
    dashboard: bool = False,
    dashboard_address: str | None = None,
    device_type: str | None = None,
    direct_to_workers: bool | None = None,
    cluster_config: Any = None,
) -> Cluster:
    """A LocalCluster of ``n_workers`` processes, or a client of the scheduler at ``address``.

    ``cluster_config`` (a :class:`rpeg.config.ClusterConfig`) supplies what the keyword
    arguments leave unset: ``worker_memory`` (default ``"auto"``: the machine's memory, or
    its cgroup limit, split over the workers), ``dashboard_address`` (default: no dashboard;
    ``dashboard=True`` alone binds ``127.0.0.1`` on a free port, never every interface),
    the TLS files for a ``tls://`` address, ``direct_to_workers`` (default True: the
    client calls workers -- the ranks' actors -- directly; Dask's own default routes every
    actor call through the scheduler, two more hops: a small call 0.7-0.8 -> 0.5 ms, a
    64 MiB argument 45 -> 19-27 ms here, docs/runtime.md "Multi-node recipe"), and ``device_type``: ``"cuda"`` starts a
    dask-cuda ``LocalCUDACluster`` with one worker per visible GPU (each pinned to its
    device through ``CUDA_VISIBLE_DEVICES``), ``"cpu"`` a plain LocalCluster."""
    cc = cluster_config
    if memory_limit is None:
        memory_limit = getattr(cc, "worker_memory", None) or "auto"
    if dashboard_address is None:
        dashboard_address = getattr(cc, "dashboard_address", None)
    if dashboard_address is None and dashboard:
        dashboard_address = "127.0.0.1:0"
    if dashboard_address and listens_on_all_interfaces(dashboard_address):
        import warnings

        warnings.warn(
            f"cluster.dashboard_address {dashboard_address!r} listens on every network "
            "interface: anyone who reaches this machine sees the Dask dashboard (task "
            "graphs, logs, a profiler). Bind 127.0.0.1:PORT and use ssh -L to view it.",
            UserWarning,
            stacklevel=2,
        )
    device_type = device_type or getattr(cc, "device_type", None) or "cpu"
    if direct_to_workers is None:
        direct_to_workers = getattr(cc, "direct_to_workers", True)
    configure_dask(torch_threads, profile=dashboard_address is not None)  # its page is there
    if not address and getattr(cc, "kind", "local") == "slurm":
        from rpeg.infra import slurm_cluster

        client, jq = slurm_cluster.start(cc, n_workers, torch_threads, direct_to_workers)
        return Cluster(client=client, local=jq, address=jq.scheduler_address, kind="slurm")
    from distributed import Client, LocalCluster

    from rpeg.runtime.actors import serializers

    serializers.register()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    if address:
        security = security_for(cc, address)
        client = Client(
            address,
            timeout="60s",
            set_as_default=False,
            security=security,
            direct_to_workers=direct_to_workers,
        )
        with contextlib.suppress(Exception):
            client.register_plugin(_preload_plugin())
        if collective_env(cc):  # the config's interface / plugin reach workers started elsewhere
            client.register_plugin(_env_plugin(collective_env(cc)))
        client.run(serializers.register)
        return Cluster(client=client, address=address, owned=False)
    common: dict[str, Any] = {
        "threads_per_worker": threads_per_worker,
        "memory_limit": _memory_limit(memory_limit),
        "silence_logs": logging.ERROR,
        "host": "127.0.0.1",
    }
    if dashboard_address:
        common["dashboard_address"] = dashboard_address
    else:  # the scheduler's HTTP server (health, metrics) still runs: on loopback
        common["dashboard_address"] = "127.0.0.1:0"
        common["scheduler_kwargs"] = {"dashboard": False}
    from rpeg.infra.interrupts import services_ignore_sigint
    from rpeg.infra.store_dirs import make_store_dir, sweep_stale

    sweep_stale()  # the folders of killed drivers, which could not remove their own
    store_dir = make_store_dir()  # mode 0700, owner recorded; removed by close()
    from rpeg.runtime.compute_thread import wait_policy_env
    from rpeg.runtime.cpu_binding import HOST_CORES

    env = {
        **collective_env(cc),
        "OMP_NUM_THREADS": str(torch_threads),
        "MKL_NUM_THREADS": str(torch_threads),
        # more torch threads than cores: idle OpenMP threads sleep instead of spinning
        **wait_policy_env(n_workers, torch_threads, len(HOST_CORES)),
        STORE_DIR_ENV: store_dir,
    }
    try:
        with services_ignore_sigint():  # Ctrl-C reaches the command, which closes the workers
            if device_type == "cuda":
                local = _local_cuda_cluster(common, env)
            else:
                local = LocalCluster(
                    n_workers=n_workers,
                    processes=True,
                    resources={"device": 1},
                    worker_class="distributed.Nanny",
                    env=env,
                    **common,
                )
    except BaseException:
        shutil.rmtree(store_dir, ignore_errors=True)
        raise
    client = Client(local, set_as_default=False, direct_to_workers=direct_to_workers)
    client.run(serializers.register)
    return Cluster(
        client=client,
        local=local,
        address=local.scheduler_address,
        owned=True,
        store_dir=store_dir,
    )


def _memory_limit(value: str | int | None) -> str | int | None:
    """``"auto"`` (Dask: system memory / workers, capped by cgroup limits), bytes, a size
    string such as ``"8GiB"``, or ``0`` / ``"0"`` / ``"none"`` for no limit."""
    if value in (0, "0", "none", "None", None):
        return 0
    return value


def _local_cuda_cluster(common: dict[str, Any], env: dict[str, str]) -> Any:  # pragma: no cover
    """dask-cuda's LocalCUDACluster: one worker process per visible GPU (gpu extra)."""
    n = cuda_device_count()
    if n == 0:
        from rpeg.errors import ConfigError, Problem

        raise ConfigError(
            [Problem("cluster.device_type", "cuda requested but no CUDA device is visible")]
        )
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        from rpeg.errors import ConfigError, Problem

        raise ConfigError(
            [
                Problem(
                    "cluster.device_type",
                    "cuda needs dask-cuda: pip install -e '.[gpu]'",
                )
            ]
        ) from None
    return LocalCUDACluster(
        n_workers=n,
        resources={"device": 1},
        env=env,
        **common,
    )


def _preload_plugin():
    from distributed.diagnostics.plugin import WorkerPlugin

    class _WorkerSetup(WorkerPlugin):
        name = "rpeg-worker-setup"

        def setup(self, worker):
            from rpeg.runtime.actors import serializers

            serializers.dask_setup(worker)

    return _WorkerSetup()
