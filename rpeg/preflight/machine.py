"""The machine a run starts on, checked before it starts: local device and worker counts
against this machine's CPUs (or GPUs), a ``tls://`` scheduler with its certificate files, an
existing scheduler's port accepting connections, the dashboard address and worker memory."""

from __future__ import annotations

import os
import re

from rpeg.config import RunConfig
from rpeg.errors import Problem

_SIZE = re.compile(r"^\s*(auto|none|0|\d+(\.\d+)?\s*([kKMGTP]i?B|B)?)\s*$")

_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):\d{1,5}$")


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity; ``os.cpu_count`` off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_device_limit(device_type: str = "cpu") -> int:
    """How many local devices this machine can host: its CPUs (at least 4: the shipped
    configs/sharded-cpu.yaml and async-cpu.yaml run four one-thread workers, slower but
    correct on a 2-core machine), or its CUDA GPUs."""
    if device_type == "cuda":
        from rpeg.infra.cluster import cuda_device_count

        return cuda_device_count()
    return max(4, machine_cpus())


# ------------------------------------------------------------------------------ machine
#: seconds the preflight waits for an existing scheduler's port to accept a connection
SCHEDULER_PROBE_S = 5.0


def check_scheduler_reachable(address: str | None) -> list[Problem]:
    """A ``tcp://`` or ``tls://`` scheduler address whose port accepts no connection (nothing
    listening, an unknown host, no route within :data:`SCHEDULER_PROBE_S`) is a problem now,
    not a 60 s connect timeout after the flow started. Only the TCP port is probed: the
    Dask handshake (and TLS) happen when the run connects."""
    import socket
    from urllib.parse import urlsplit

    if not address or not re.match(r"^(tcp|tls)://", address):
        return []
    try:
        parts = urlsplit(address)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        return [
            Problem("cluster.address", f"{address!r}: expected tcp://host:port or tls://host:port")
        ]
    try:
        socket.create_connection((host, port), timeout=SCHEDULER_PROBE_S).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return [Problem("cluster.address", f"no scheduler answers at {address}: {why}")]
    return []


def check_machine(config: RunConfig, *, cluster_devices: int | None = None) -> list[Problem]:
    cc = config.cluster
    out: list[Problem] = []
    address = cc.address
    if address is None and cluster_devices is None:
        limit = machine_device_limit(cc.device_type)
        what = "CUDA devices" if cc.device_type == "cuda" else "CPUs"
        has = f"{limit} {what}"
        if cc.device_type != "cuda" and machine_cpus() != limit:  # fewer than 4 CPUs
            has = f"{machine_cpus()} CPUs (up to {limit} one-thread CPU workers run here)"
        if cc.device_type == "cuda" and limit == 0:
            out.append(Problem("cluster.device_type", "cuda, but no CUDA device is visible"))
        else:
            if cc.num_devices is not None and cc.num_devices > limit:
                out.append(
                    Problem(
                        "cluster.num_devices",
                        f"{cc.num_devices} local devices, but this machine has {has} "
                        "(one worker process per device); use --cluster for more",
                    )
                )
            if cc.device_type == "cpu" and cc.n_workers > limit:
                out.append(
                    Problem(
                        "cluster.n_workers",
                        f"{cc.n_workers} local workers, but this machine has {has}",
                    )
                )
    if address and address.startswith("tls://"):
        for f in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            v = getattr(cc, f)
            if not v:
                out.append(Problem(f"cluster.{f}", f"needed for the tls:// scheduler {address}"))
            elif not os.path.isfile(v):
                out.append(Problem(f"cluster.{f}", f"{v!r} not found"))
    elif address and not re.match(r"^(tcp|tls|inproc|ucx|ws|wss)://", address):
        out.append(
            Problem("cluster.address", f"{address!r}: expected tcp://host:port or tls://host:port")
        )
    if cc.dashboard_address is not None and not _HOSTPORT.match(cc.dashboard_address):
        out.append(
            Problem(
                "cluster.dashboard_address",
                f"{cc.dashboard_address!r}: expected host:port, e.g. 127.0.0.1:8787",
            )
        )
    if not _SIZE.match(cc.worker_memory):
        out.append(
            Problem(
                "cluster.worker_memory",
                f"{cc.worker_memory!r}: expected auto, 0 (no limit) or a size such as 8GiB",
            )
        )
    return out
