"""Where a rank is and how ranks find each other.

* :func:`rank_device` -- the device of a rank from its group's compiled layout
  (``device_type``): ``cuda:0`` when the worker sees one GPU (dask-cuda's ``LocalCUDACluster``
  and ``dask cuda worker`` give every worker its own ``CUDA_VISIBLE_DEVICES``), else
  ``cuda:<plan device index mod visible GPUs>``; ``cpu`` otherwise.
* :func:`worker_host` -- the host part of the Dask worker's own address (the interface the
  scheduler reaches it on), not ``gethostbyname(gethostname())`` (127.0.1.1 on many hosts).
* :func:`master_store` / :func:`join_store` -- a ``TCPStore`` on rank 0 bound to port 0: the
  OS picks a free port and the store keeps it bound, so no other process can take the port
  between choosing and binding it (the race of "find a free port, release it, bind it again");
  rank 0 reports ``host:port`` and the other ranks connect. A TCPStore listens on every
  interface (torch has no bind address for it), so when the worker's own address is a
  loopback one (a LocalCluster: every rank is on this machine) the store is a ``FileStore`` in
  a private temporary folder instead and nothing listens at all; rank 0 reports
  ``file:<path>``.
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import Any

import torch


def rank_device(group: dict[str, Any], rank: int) -> torch.device:
    """The device of ``rank`` of ``group`` (a compiled ``ActorGroupSpec`` as a dict)."""
    if group.get("device_type", "cpu") != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"group {group.get('name')} is compiled for CUDA but this worker sees no GPU "
            "(start the workers with dask-cuda, or plan for the CPU cluster)"
        )
    n = torch.cuda.device_count()
    idx = 0 if n == 1 else int(group["devices"][rank]) % n
    return torch.device("cuda", idx)


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


def master_store(timeout_s: float = 120.0) -> tuple[Any, str]:
    """The store of a new group, kept by rank 0; (store, address for the other ranks).

    On a loopback worker address a ``FileStore`` (``file:<path>``, nothing listens); else a
    TCPStore master on this worker's host, port chosen by the OS (``host:port``)."""
    import tempfile

    import torch.distributed as dist

    host = worker_host()
    if _is_loopback(host):
        path = str(Path(tempfile.mkdtemp(prefix="rpeg-store-")) / "store")  # mode 0700
        return dist.FileStore(path, -1), f"file:{path}"
    store = dist.TCPStore(
        host,
        0,
        None,
        True,
        datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return store, f"{host}:{store.port}"


def join_store(address: str, timeout_s: float = 120.0) -> Any:
    """A client of the store at ``address`` (``file:<path>`` or ``host:port``)."""
    import torch.distributed as dist

    if address.startswith("file:"):
        return dist.FileStore(address[len("file:") :], -1)
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(
        host.strip("[]"), int(port), None, False, datetime.timedelta(seconds=timeout_s)
    )


def standalone_group(store: Any, prefix: str, rank: int, size: int, backend: str, timeout_s: float):
    """A process group outside the default one (a rank is in at most one default group; the
    weight-sync group spans ranks of two actor groups)."""
    import torch.distributed as dist

    st = dist.PrefixStore(prefix, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(st, rank, size)
    return dist.ProcessGroupGloo(st, rank, size, timeout)


def broadcast(pg: Any, tensor: torch.Tensor, root: int = 0) -> None:
    """In-place broadcast of ``tensor`` from ``root`` over a standalone group."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = root
    pg.broadcast([tensor], opts).wait()
