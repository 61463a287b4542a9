"""The weight-update data plane between a :class:`~rpeg.runtime.engines.vllm.VLLMEngine`
(the process that owns the ``vllm.LLM``: the trainer's source of weights) and vLLM's workers.

vLLM's own recipe for RL (its RLHF examples and the V1 weight-transfer API): the *metadata*
of an update -- names, dtypes, shapes and the bucket boundaries -- goes through
``LLM.collective_rpc``; the *tensors* go through a process group between the trainer side and
every worker. Tensors are never RPC arguments: V1's engine core decodes msgpack'd tensors
untyped (a tensor arrives as ``['float32', [512, 1024], 1]``, small ones fail with ``cannot
pickle memoryview``).

This module holds what both ends share and needs no vLLM: the typed update plan
(:class:`BucketPlan` of :class:`PlanEntry`), its wire form (plain lists: what msgpack carries),
the packing of one bucket into one flat tensor and the views back out of it, and the group
(a :class:`UpdateGroup`: rank 0 the engine's owner, rank ``1 + tp rank`` each worker; gloo,
a ``FileStore`` in a private folder: every member runs on this host).
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rpeg.errors import RpegError

#: The prefix of the update group's keys in its store.
GROUP_PREFIX = "rpeg-vllm-update"
#: Offsets of tensors inside a bucket are rounded up to this many elements (views stay
#: aligned for every kernel; the padding is never sent as weights).
ALIGN_ELEMS = 16


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the wire form of a dtype)."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise RpegError(f"unknown dtype {name!r} in a weight-update plan")
    return dt


@dataclass(frozen=True)
class PlanEntry:
    """One tensor of a bucket: its checkpoint name, shape and place in the flat buffer."""

    name: str
    shape: tuple[int, ...]
    offset: int  # elements into the bucket
    numel: int

    def to_wire(self) -> list[Any]:
        return [self.name, list(self.shape), self.offset, self.numel]

    @classmethod
    def from_wire(cls, w: list[Any]) -> PlanEntry:
        name, shape, offset, numel = w
        return cls(str(name), tuple(int(d) for d in shape), int(offset), int(numel))


@dataclass(frozen=True)
class BucketPlan:
    """One broadcast of an update: tensors of one dtype, ``numel`` elements in all."""

    dtype: str
    numel: int
    entries: tuple[PlanEntry, ...]

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=dtype_of(self.dtype)).element_size()

    def to_wire(self) -> list[Any]:
        return [self.dtype, self.numel, [e.to_wire() for e in self.entries]]

    @classmethod
    def from_wire(cls, w: list[Any]) -> BucketPlan:
        dtype, numel, entries = w
        dtype_of(str(dtype))
        return cls(str(dtype), int(numel), tuple(PlanEntry.from_wire(e) for e in entries))


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[BucketPlan]:
    """Consecutive runs of ``named`` (in order: vLLM loads a layer once all its tensors
    arrived, so keeping a layer's tensors together bounds its buffering) of one dtype and at
    most ``bucket_bytes`` each, alignment padding included; a larger tensor goes alone."""
    out: list[BucketPlan] = []
    cur: list[PlanEntry] = []
    cur_dtype = ""
    end = 0  # elements used by the current bucket

    for name, t in named:
        dn = dtype_name(t.dtype)
        k = t.numel()
        start = -(-end // ALIGN_ELEMS) * ALIGN_ELEMS
        if cur and (dn != cur_dtype or (start + k) * t.element_size() > bucket_bytes):
            out.append(BucketPlan(cur_dtype, end, tuple(cur)))
            cur, start = [], 0
        cur_dtype = dn
        cur.append(PlanEntry(name, tuple(t.shape), start, k))
        end = start + k
    if cur:
        out.append(BucketPlan(cur_dtype, end, tuple(cur)))
    return out


def pack_bucket(
    plan: BucketPlan, tensors: Mapping[str, torch.Tensor], device: Any = "cpu"
) -> torch.Tensor:
    """The flat buffer of one bucket on ``device`` (the sender's side of a transfer)."""
    flat = torch.zeros(plan.numel, dtype=dtype_of(plan.dtype), device=device)
    for e in plan.entries:
        flat[e.offset : e.offset + e.numel].copy_(tensors[e.name].detach().reshape(-1))
    return flat


def unpack_bucket(plan: BucketPlan, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, view)`` of every tensor of a received bucket (views: no copy)."""
    for e in plan.entries:
        yield e.name, flat[e.offset : e.offset + e.numel].view(e.shape)


# --------------------------------------------------------------------------- the group
def _gloo_group(store: Any, rank: int, size: int, timeout_s: float) -> Any:
    import torch.distributed as dist

    st = dist.PrefixStore(GROUP_PREFIX, store)
    return dist.ProcessGroupGloo(st, rank, size, datetime.timedelta(seconds=timeout_s))


def join_group(address: str, rank: int, size: int, timeout_s: float) -> Any:
    """A worker's member of the update group at ``address`` (``file:<path>``)."""
    import torch.distributed as dist

    if not address.startswith("file:"):
        raise RpegError(f"update group address {address!r}: expected file:<path>")
    return _gloo_group(dist.FileStore(address[len("file:") :], -1), rank, size, timeout_s)


def broadcast_async(pg: Any, tensor: torch.Tensor) -> Any:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return pg.broadcast([tensor], opts)


def receive_bucket(pg: Any, plan: BucketPlan, device: torch.device) -> torch.Tensor:
    """A worker's receive of one bucket (gloo: into host memory, then onto ``device``)."""
    flat = torch.empty(plan.numel, dtype=dtype_of(plan.dtype))
    broadcast_async(pg, flat).wait()
    return flat if device.type == "cpu" else flat.to(device)


def wait_both(work: Any, rpc: Future, timeout_s: float, what: str) -> None:
    """Wait for the local side of a collective (``work``) while the workers' RPC runs: an
    RPC that fails first (a worker that never joins the collective) is raised at once
    instead of leaving this side in the collective until its timeout."""
    t_end = time.monotonic() + timeout_s
    while not work.is_completed():
        if rpc.done() and rpc.exception() is not None:
            raise RpegError(f"vLLM workers failed during {what}: {rpc.exception()}")
        if time.monotonic() > t_end:
            raise RpegError(f"{what}: no answer from the vLLM workers in {timeout_s:.0f} s")
        time.sleep(0.001)
    work.wait()


class UpdateGroup:
    """The owner's side (rank 0) of the update group: a private ``FileStore`` folder,
    removed by :meth:`close`."""

    def __init__(self, size: int, timeout_s: float):
        import torch.distributed as dist

        self.folder = Path(tempfile.mkdtemp(prefix="rpeg-vllm-pg-"))  # mode 0700
        self.address = f"file:{self.folder / 'store'}"
        self.size = size
        self.timeout_s = timeout_s
        self._store = dist.FileStore(str(self.folder / "store"), -1)
        self.pg: Any = None
        self.device = torch.device("cpu")  # where buckets are packed for this transport
        self.kind = "gloo"

    def connect(self) -> None:
        """Rank 0's join (blocks until every worker joined: call while their RPC runs)."""
        self.pg = _gloo_group(self._store, 0, self.size, self.timeout_s)

    def send(self, flat: torch.Tensor) -> Any:
        """Broadcast one packed bucket to the workers; the work to wait on."""
        return broadcast_async(self.pg, flat)

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None:
            with contextlib.suppress(Exception):  # a member already gone: nothing to free
                pg.shutdown()
        self._store = None
        shutil.rmtree(self.folder, ignore_errors=True)
