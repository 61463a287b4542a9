"""The GPU transports of a vLLM weight update (rpeg.runtime.engines.vllm_transfer has the
protocol and the gloo transport): which transport an update takes, CUDA IPC and NCCL.

Which one (:func:`choose_transport`, a function of where the tensors are):

- ``gloo`` -- the source tensors or a worker on CPU (vLLM's CPU build), or a GPU layout
  neither below covers (some workers on the source's GPU, some not): buckets go through
  host memory;
- ``cuda_ipc`` -- every worker on the source's GPU (a colocated engine: the runtimes build
  one vLLM per rank, on the rank's GPU): each bucket is packed on that GPU and shared as a
  CUDA IPC handle (:class:`IpcBucket`: plain numbers and bytes, what vLLM's msgpack carries
  without its pickle fallback); the worker opens it (:func:`rebuild_bucket`), no host copy;
- ``nccl`` -- every worker on another GPU than the source's: a NCCL group of the source
  (rank 0) and the workers (vLLM's ``StatelessProcessGroup`` + ``PyNcclCommunicator``, as
  vLLM's RLHF example); NCCL allows one member per GPU, hence the rule above.

GPUs are compared by their physical UUID (:class:`DeviceId`): device indices differ between
processes with different ``CUDA_VISIBLE_DEVICES``. Only the choice and the wire forms run on
CPU (tests/runtime/test_vllm_transports.py); the IPC and NCCL paths need CUDA and are
``gpu``-marked tests (tests/runtime/test_vllm_gpu.py), never run on the CPU machines.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rpeg.errors import RpegError
from rpeg.runtime.engines.vllm_transfer import BucketPlan, dtype_of, pack_bucket

GLOO, CUDA_IPC, NCCL = "gloo", "cuda_ipc", "nccl"
#: Every transport an update may take (``VLLMEngine(transport=...)`` forces one).
TRANSPORTS = (GLOO, CUDA_IPC, NCCL)


def check_transport(name: str) -> str:
    if name not in TRANSPORTS:
        raise RpegError(f"vLLM weight transport {name!r}; allowed: {', '.join(TRANSPORTS)}")
    return name


@dataclass(frozen=True)
class DeviceId:
    """Where tensors live, comparable across processes: ``type`` ``cpu``/``cuda``, the GPU's
    physical ``uuid`` ("" on CPU) and this process's ``index`` of it (-1 on CPU)."""

    type: str
    uuid: str = ""
    index: int = -1

    def to_wire(self) -> list[Any]:
        return [self.type, self.uuid, self.index]

    @classmethod
    def from_wire(cls, w: list[Any]) -> DeviceId:
        kind, uuid, index = w
        return cls(str(kind), str(uuid), int(index))


def device_id(device: torch.device) -> DeviceId:
    if device.type != "cuda":
        return DeviceId(device.type)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceId("cuda", str(torch.cuda.get_device_properties(index).uuid), index)


def choose_transport(source: DeviceId, workers: Sequence[DeviceId]) -> str:
    """The transport of an update from tensors on ``source`` to ``workers`` (module doc)."""
    if not workers:
        raise RpegError("a vLLM weight update with no workers")
    if source.type != "cuda" or any(w.type != "cuda" for w in workers):
        return GLOO
    same = [w.uuid == source.uuid for w in workers]
    if all(same):
        return CUDA_IPC
    if not any(same) and len({w.uuid for w in workers}) == len(workers):
        return NCCL
    return GLOO  # mixed, or two workers on one GPU: NCCL refuses, IPC is not wired


# --------------------------------------------------------------------------- CUDA IPC
@dataclass(frozen=True)
class IpcBucket:
    """One bucket shared by CUDA IPC: its plan and the arguments torch's
    ``rebuild_cuda_tensor`` needs, as plain values (``reduce_tensor`` gives them with torch
    classes in, which vLLM's msgpack refuses)."""

    plan: BucketPlan
    gpu_uuid: str
    tensor_offset: int  # elements into the storage
    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync_required: bool

    def to_wire(self) -> list[Any]:
        return [
            self.plan.to_wire(),
            self.gpu_uuid,
            self.tensor_offset,
            self.storage_handle,
            self.storage_size_bytes,
            self.storage_offset_bytes,
            self.ref_counter_handle,
            self.ref_counter_offset,
            self.event_handle,
            self.event_sync_required,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> IpcBucket:
        plan, uuid, off, handle, size, soff, rc, rcoff, event, sync = w
        return cls(
            BucketPlan.from_wire(plan),
            str(uuid),
            int(off),
            bytes(handle),
            int(size),
            int(soff),
            bytes(rc),
            int(rcoff),
            None if event is None else bytes(event),
            bool(sync),
        )


def share_bucket(plan: BucketPlan, flat: torch.Tensor) -> IpcBucket:
    """The IPC form of ``flat`` (a packed bucket on a GPU; the caller keeps it alive until
    the workers have loaded it)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if flat.device.type != "cuda":
        raise RpegError(f"CUDA IPC shares GPU tensors; this bucket is on {flat.device}")
    _, a = reduce_tensor(flat)
    # (cls, size, stride, offset, storage_cls, dtype, device, handle, size_bytes,
    #  offset_bytes, requires_grad, rc_handle, rc_offset, event_handle, event_sync)
    return IpcBucket(
        plan, device_id(flat.device).uuid, int(a[3]), bytes(a[7]), int(a[8]), int(a[9]),
        bytes(a[11]), int(a[12]), None if a[13] is None else bytes(a[13]), bool(a[14]),
    )  # fmt: skip


def rebuild_bucket(b: IpcBucket, device: torch.device) -> torch.Tensor:
    """A worker's view of a shared bucket, opened on ``device`` (which must be the bucket's
    GPU: the sender's index of it may differ from this process's)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    here = device_id(device)
    if here.uuid != b.gpu_uuid:
        raise RpegError(f"CUDA IPC bucket of GPU {b.gpu_uuid} opened on GPU {here.uuid}")
    dt = dtype_of(b.plan.dtype)
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size([b.plan.numel]), (1,), b.tensor_offset,
        torch.storage.TypedStorage, dt, here.index, b.storage_handle, b.storage_size_bytes,
        b.storage_offset_bytes, False, b.ref_counter_handle, b.ref_counter_offset,
        b.event_handle, b.event_sync_required,
    )  # fmt: skip


def send_ipc(
    llm: Any,
    plan: Sequence[BucketPlan],
    tensors: Mapping[str, torch.Tensor],
    device: torch.device,
    timeout_s: float,
    share: Callable[[BucketPlan, torch.Tensor], IpcBucket] = share_bucket,
) -> list[int]:
    """One update by CUDA IPC: every bucket packed on ``device`` (the update holds one
    packed copy of the weights there until the workers loaded it) and shared; one
    ``rpeg_receive_ipc`` on every worker. Returns each worker's loaded-tensor count."""
    flats = [pack_bucket(b, tensors, device) for b in plan]
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # packed before anyone reads
    wire = [share(b, f).to_wire() for b, f in zip(plan, flats, strict=True)]
    out = llm.collective_rpc("rpeg_receive_ipc", timeout=timeout_s, args=(wire,))
    del flats
    if device.type == "cuda":
        torch.cuda.ipc_collect()  # free what the workers have released
    return out


# --------------------------------------------------------------------------- NCCL
class NcclWork:
    """A broadcast enqueued on a CUDA stream, with the ``is_completed`` / ``wait`` of a
    process-group work (what :func:`~rpeg.runtime.engines.vllm_transfer.wait_both` polls)."""

    def __init__(self, stream: Any):
        self.event = torch.cuda.Event()
        self.event.record(stream)

    def is_completed(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()


class NcclLink:
    """A member of the NCCL update group (rank 0 the source, ``1 + tp rank`` each worker):
    vLLM's ``StatelessProcessGroup`` on a TCP store at ``address`` (``tcp:HOST:PORT``,
    rank 0 serves it) and a ``PyNcclCommunicator`` on ``device``."""

    def __init__(self, address: str, rank: int, size: int, device: torch.device, timeout_s: float):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        host, port = parse_tcp(address)
        self.device, self.rank = device, rank
        pg = StatelessProcessGroup.create(
            host=host, port=port, rank=rank, world_size=size, store_timeout=int(timeout_s)
        )
        self.comm = PyNcclCommunicator(pg, device=device)  # blocks until all joined

    def send(self, flat: torch.Tensor) -> NcclWork:
        stream = torch.cuda.current_stream(self.device)
        self.comm.broadcast(flat, src=0, stream=stream)
        return NcclWork(stream)

    def receive(self, plan: BucketPlan, device: torch.device) -> torch.Tensor:
        flat = torch.empty(plan.numel, dtype=dtype_of(plan.dtype), device=self.device)
        self.send(flat).wait()  # a broadcast from rank 0 into flat
        return flat if device == self.device else flat.to(device)

    def shutdown(self) -> None:
        self.comm = None


def parse_tcp(address: str) -> tuple[str, int]:
    host, sep, port = address.removeprefix("tcp:").rpartition(":")
    if not address.startswith("tcp:") or not sep or not port.isdigit():
        raise RpegError(f"NCCL update group address {address!r}: expected tcp:HOST:PORT")
    return host, int(port)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class NcclUpdateGroup:
    """The source's side of the NCCL update group (the gloo ``UpdateGroup``'s interface):
    ``connect`` while the workers' join RPC runs, ``send`` a bucket, ``close``."""

    def __init__(self, size: int, device: torch.device, timeout_s: float):
        self.size, self.device, self.timeout_s = size, device, timeout_s
        self.kind = NCCL
        self.address = f"tcp:127.0.0.1:{free_port()}"  # vLLM's workers run on this host
        self.link: NcclLink | None = None

    def connect(self) -> None:
        self.link = NcclLink(self.address, 0, self.size, self.device, self.timeout_s)

    def send(self, flat: torch.Tensor) -> NcclWork:
        assert self.link is not None, "send before connect"
        return self.link.send(flat)

    def close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.shutdown()


def worker_devices(llm: Any, timeout_s: float) -> list[DeviceId]:
    """Every worker's device (``rpeg_device`` on each)."""
    return [DeviceId.from_wire(w) for w in llm.collective_rpc("rpeg_device", timeout=timeout_s)]
