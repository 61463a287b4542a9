"""Where a rank is and how ranks find each other.

* :func:`rank_device` -- the device of a rank from its group's compiled layout
  (``device_type``) and its worker's GPU slot (:func:`gpu_slots`); ``cpu`` for a CPU group.
* :func:`worker_gpus` / :func:`gpu_slots` -- which local CUDA index is each worker's own GPU.
  dask-cuda (``LocalCUDACluster``, ``dask cuda worker``) gives every worker the *full* list of
  the host's GPUs, rotated so that its own comes first (``CUDA_VISIBLE_DEVICES=2,3,0,1`` for
  the third of four): its GPU is ``cuda:0``, and a plan device index taken modulo the visible
  GPUs would put two ranks on one GPU (NCCL: "Duplicate GPU detected"). Plain workers (a
  LocalCluster, ``dask worker``) all see the same GPUs: each takes the GPU of its slot among
  the run's workers on its host.
* :func:`worker_host` -- the host part of the Dask worker's own address (the interface the
  scheduler reaches it on), not ``gethostbyname(gethostname())`` (127.0.1.1 on many hosts).
* :func:`master_store` / :func:`join_store` -- a ``TCPStore`` on rank 0 bound to port 0: the
  OS picks a free port and the store keeps it bound, so no other process can take the port
  between choosing and binding it (the race of "find a free port, release it, bind it again");
  rank 0 reports ``host:port`` and the other ranks connect. The store's socket is bound to
  the worker's own address (the interface the scheduler reaches it on, ``cluster.interface``
  for a Slurm cluster) and handed to the TCPStore (``master_listen_fd``): torch binding it
  itself would listen on every interface. The store itself has no authentication; with the
  cluster's TLS files it listens on loopback only and is reached through a mutual-TLS front
  (rpeg.runtime.actors.store_tls; docs/operating.md "What the network carries"). When the worker's own address is a loopback one (a
  LocalCluster: every rank is on this machine) the store is a ``FileStore`` in a private
  temporary folder instead and nothing listens at all; rank 0 reports ``file:<path>``.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rpeg.compile.step import GroupSpec
from rpeg.errors import RpegError
from rpeg.runtime.actors.store_tls import TlsFiles, tls_back, tls_front

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as C10dBackend


@dataclass(frozen=True)
class WorkerGpus:
    """What one Dask worker sees of the GPUs: its host and its ``CUDA_VISIBLE_DEVICES``
    (None: unset, every GPU of the host)."""

    host: str
    visible: str | None


def worker_gpus() -> WorkerGpus:
    """This process's view (run on every worker through ``client.run``)."""
    return WorkerGpus(socket.gethostname(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_slots(views: Mapping[str, WorkerGpus]) -> dict[str, int]:
    """Worker address -> the local CUDA index of that worker's own GPU. ``views``: the run's
    workers in placement order. On a host whose workers see *different* lists (dask-cuda's
    rotated lists, or one GPU each) every worker's own GPU is the first of its list: index 0.
    On a host whose workers all see the same GPUs, worker i of the host (placement order)
    takes index i."""
    by_host: dict[str, list[str]] = {}
    for addr, v in views.items():
        by_host.setdefault(v.host, []).append(addr)
    out: dict[str, int] = {}
    for addrs in by_host.values():
        shared = len({views[a].visible for a in addrs}) == 1
        for i, a in enumerate(addrs):
            out[a] = i if shared else 0
    return out


def rank_device(group: GroupSpec, rank: int, gpu_slot: int | None = None) -> torch.device:
    """The device of ``rank`` of ``group`` (a compiled :class:`GroupSpec`) on a
    worker whose own GPU is local index ``gpu_slot`` (:func:`gpu_slots`; None: one visible
    GPU is index 0, else the plan's device index modulo the visible GPUs)."""
    if group.device_type != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"group {group.name} is compiled for CUDA but this worker sees no GPU "
            "(start the workers with dask-cuda, or plan for the CPU cluster)"
        )
    n = torch.cuda.device_count()
    if gpu_slot is None:
        return torch.device("cuda", 0 if n == 1 else group.devices[rank] % n)
    if gpu_slot >= n:
        raise RuntimeError(
            f"group {group.name} rank {rank}: this worker is GPU slot {gpu_slot} of its "
            f"host but sees {n} GPU(s) (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): more workers than GPUs on the host"
        )
    return torch.device("cuda", gpu_slot)


def worker_host() -> str:
    """Host of this process's Dask worker address (falls back to the hostname's address)."""
    try:
        from distributed import get_worker

        addr = get_worker().address  # e.g. tcp://10.0.0.5:40123, tcp://[::1]:40123
        hostport = addr.split("://", 1)[-1]
        host = hostport.rsplit(":", 1)[0]
        return host.strip("[]")
    except (ImportError, ValueError):
        return socket.gethostbyname(socket.gethostname())


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def master_store(timeout_s: float = 120.0, tls: TlsFiles | None = None) -> tuple[Any, str]:
    """The store of a new group, kept by rank 0; (store, address for the other ranks).

    On a loopback worker address a ``FileStore`` (``file:<path>``, nothing listens); else a
    TCPStore master on this worker's host, port chosen by the OS (``host:port``). With the
    cluster's ``tls`` files the store listens on loopback only and other hosts reach it through
    a mutual-TLS front on this worker's host (``tls:host:port``; rpeg.runtime.actors.store_tls)."""
    import tempfile

    import torch.distributed as dist

    host = worker_host()
    if _is_loopback(host):
        parent = os.environ.get("RPEG_STORE_DIR")  # a LocalCluster's, removed at its close
        parent = parent if parent and os.path.isdir(parent) else None
        path = str(Path(tempfile.mkdtemp(prefix="rpeg-store-", dir=parent)) / "store")  # 0700
        return dist.FileStore(path, -1), f"file:{path}"
    if tls is not None:
        store = _tcp_master("127.0.0.1", timeout_s)
        front = tls_front(host, store.port, tls)  # lives (its thread) as long as the process
        return store, f"tls:{host}:{front.port}"
    store = _tcp_master(host, timeout_s)
    return store, f"{host}:{store.port}"


def _tcp_master(host: str, timeout_s: float) -> Any:
    """A TCPStore master bound to ``host`` only (torch binds every interface when it binds
    itself): the socket is bound here, on port 0 (the OS picks a free one), and handed over."""
    import torch.distributed as dist

    lsock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        lsock.bind((host, 0))
        lsock.listen(256)
    except OSError:
        lsock.close()
        raise
    return dist.TCPStore(
        host,
        lsock.getsockname()[1],
        None,
        True,
        datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=lsock.detach(),  # the store owns the socket from here on
    )


def join_store(address: str, timeout_s: float = 120.0, tls: TlsFiles | None = None) -> Any:
    """A client of the store at ``address`` (``file:<path>``, ``host:port``, or
    ``tls:host:port`` reached through a local forwarder that speaks mutual TLS with the
    cluster's ``tls`` files)."""
    import torch.distributed as dist

    if address.startswith("file:"):
        return dist.FileStore(address[len("file:") :], -1)
    if address.startswith("tls:"):
        if tls is None:
            raise RpegError(
                f"the group's store {address} is behind TLS and this rank has no "
                "cluster.tls_ca_file / tls_cert_file / tls_key_file"
            )
        host, port = address[len("tls:") :].rsplit(":", 1)
        back = tls_back(host.strip("[]"), int(port), tls)
        host, port = "127.0.0.1", str(back.port)
    else:
        host, port = address.rsplit(":", 1)
    return dist.TCPStore(
        host.strip("[]"), int(port), None, False, datetime.timedelta(seconds=timeout_s)
    )


def standalone_group(
    store: Any, prefix: str, rank: int, size: int, backend: str, timeout_s: float
) -> C10dBackend:
    """A process group outside the default one (a rank is in at most one default group; the
    weight-sync group spans ranks of two actor groups)."""
    import torch.distributed as dist

    st = dist.PrefixStore(prefix, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":  # the timeout travels in the options (NCCL's watchdog reads it)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(st, rank, size, opts)
    return dist.ProcessGroupGloo(st, rank, size, timeout)


def broadcast(pg: Any, tensor: torch.Tensor, root: int = 0) -> None:
    """In-place broadcast of ``tensor`` from ``root`` over a standalone group."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = root
    pg.broadcast([tensor], opts).wait()
