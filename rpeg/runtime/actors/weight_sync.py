"""Bucketed weight sync: the trainer's state dict as fixed-size flat buckets.

``pack`` flattens tensors (grouped by dtype, in name order) into buckets of at most
``bucket_bytes`` (a tensor larger than a bucket gets a bucket of its own); ``unpack`` restores
them bit-exactly. Each bucket is one contiguous tensor, so it moves as one broadcast over the
weight-sync process group (trainer rank 0 -> every generator rank: :func:`broadcast_weights`
/ :func:`receive_weights`, called by ``RankActor.send_weights`` / ``recv_weights``) instead of
one message per parameter. ``layout`` gives a receiver the same
buckets, empty, from its own model's full shapes.

Device memory: a bucket is built, broadcast and unpacked on the device the weights live on
(``pack(..., device=)``, ``layout(..., device=)``, :func:`unpack_views`): between GPU ranks
the weights never pass through the host (the gathered tensors are concatenated into a bucket
on the GPU, NCCL broadcasts it, the receiver loads views of its bucket). On the CPU nothing
changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rpeg.compile.step import DEFAULT_BUCKET_BYTES
from rpeg.runtime.step.staleness import within_bound


@dataclass(frozen=True)
class BucketEntry:
    name: str
    shape: tuple[int, ...]
    offset: int  # elements into the bucket
    numel: int


@dataclass
class Bucket:
    dtype: torch.dtype
    entries: list[BucketEntry]
    flat: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def _groups(
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]], bucket_bytes: int
) -> list[tuple[torch.dtype, list[str]]]:
    """[(dtype, [names])] per bucket: names by dtype (first seen in name order), then name."""
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name in sorted(meta):
        by_dtype.setdefault(meta[name][1], []).append(name)
    out: list[tuple[torch.dtype, list[str]]] = []
    for dtype, names in by_dtype.items():
        elem = torch.empty((), dtype=dtype).element_size()
        cap = max(1, bucket_bytes // elem)
        cur: list[str] = []
        size = 0
        for n in names:
            k = _numel(meta[n][0])
            if cur and size + k > cap:
                out.append((dtype, cur))
                cur, size = [], 0
            cur.append(n)
            size += k
        if cur:
            out.append((dtype, cur))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _entries(
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]], names: Iterable[str]
) -> tuple[list[BucketEntry], int]:
    entries: list[BucketEntry] = []
    off = 0
    for n in names:
        k = _numel(meta[n][0])
        entries.append(BucketEntry(n, tuple(meta[n][0]), off, k))
        off += k
    return entries, off


def pack(
    tensors: dict[str, torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: torch.device | str = "cpu",
) -> list[Bucket]:
    """``tensors`` flattened into buckets on ``device`` (one copy of each tensor, straight
    from wherever it lives: no host round trip for GPU tensors packed on their GPU)."""
    meta = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
    return list(stream_buckets(meta, tensors.__getitem__, bucket_bytes, device))


def stream_buckets(
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]],
    fetch: Callable[[str], torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: torch.device | str = "cpu",
) -> Iterator[Bucket]:
    """:func:`pack`'s buckets one at a time, each tensor asked for (``fetch(name)``: e.g.
    gathered from its shards) only when its bucket is filled -- a sender holds one bucket
    and one gathered tensor at a time, not the whole model twice. ``fetch`` is called in
    the same order on every rank (the gathers are collectives)."""
    for dtype, names in _groups(meta, bucket_bytes):
        entries, n = _entries(meta, names)
        flat = torch.empty(n, dtype=dtype, device=device)
        for e in entries:
            flat[e.offset : e.offset + e.numel].copy_(fetch(e.name).detach().reshape(-1))
        yield Bucket(dtype, entries, flat)


def layout(
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: torch.device | str = "cpu",
) -> list[Bucket]:
    """Empty buckets on ``device`` with the layout :func:`pack` gives tensors of these shapes
    and dtypes (the receive buffers of a broadcast: a receiver knows its own model's full
    shapes)."""
    out = []
    for dtype, names in _groups(meta, bucket_bytes):
        entries, n = _entries(meta, names)
        out.append(Bucket(dtype, entries, torch.empty(n, dtype=dtype, device=device)))
    return out


def unpack(buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    """The tensors of ``buckets``, each its own copy (the buckets may be reused)."""
    return {k: v.clone() for k, v in unpack_views(buckets).items()}


def unpack_views(buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    """The tensors of ``buckets`` as views into them, on the buckets' device (no copy: a
    received bucket is read once by the loader and then dropped)."""
    out = {}
    for b in buckets:
        for e in b.entries:
            out[e.name] = b.flat[e.offset : e.offset + e.numel].view(e.shape)
    return out


def total_bytes(buckets: list[Bucket]) -> int:
    return sum(b.nbytes for b in buckets)


def broadcast_weights(
    pg: Any,
    full: dict[str, torch.Tensor],
    version: int,
    bucket_bytes: int,
    device: torch.device | str,
) -> tuple[int, int]:
    """Sender side of a sync over the weight-sync group ``pg`` (rank 0): the policy version,
    then ``full`` packed in ``bucket_bytes`` buckets on ``device`` (where ``full`` already
    lives on a GPU: no host copy), one broadcast each. -> (bytes sent, buckets)."""
    meta = {k: (tuple(v.shape), v.dtype) for k, v in full.items()}
    buckets = stream_buckets(meta, full.__getitem__, bucket_bytes, device)
    return send_buckets(pg, buckets, version, device)


def send_buckets(
    pg: Any, buckets: Iterable[Bucket], version: int, device: torch.device | str
) -> tuple[int, int]:
    """Broadcast the policy version, then each of ``buckets`` as it comes, from sync rank 0
    of ``pg`` (on ``device``) -> (bytes sent, buckets). ``pg`` None (a trainer rank that
    only takes part in the gathers): the buckets are made and dropped."""
    from rpeg.runtime.actors.rendezvous import broadcast

    if pg is not None:
        broadcast(pg, torch.tensor([version], dtype=torch.long, device=device))
    nbytes = n = 0
    for b in buckets:
        if pg is not None:
            broadcast(pg, b.flat)
        nbytes += b.nbytes
        n += 1
    return nbytes, n


def receive_buckets(
    pg: Any,
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]],
    bucket_bytes: int,
    device: torch.device | str,
) -> dict[str, torch.Tensor]:
    """The weight buckets of :func:`send_buckets`, received into buffers on ``device`` laid
    out from this rank's own full shapes ``meta`` (same names, dtypes and order as the
    sender's) -> the weights: copies on the CPU, views of the received buckets on a device
    (loaded from device memory, never through the host)."""
    from rpeg.runtime.actors.rendezvous import broadcast

    buckets = layout(meta, bucket_bytes, device=device)
    for b in buckets:
        broadcast(pg, b.flat, root=0)
    if torch.device(device).type == "cpu":
        return unpack(buckets)
    return unpack_views(buckets)


def receive_weights(
    pg: Any,
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]],
    bucket_bytes: int,
    device: torch.device | str,
) -> tuple[dict[str, torch.Tensor], int]:
    """Receiver side of :func:`broadcast_weights` / :func:`send_buckets` -> (weights on
    ``device``: :func:`receive_buckets`, policy version)."""
    from rpeg.runtime.actors.rendezvous import broadcast

    version = torch.zeros(1, dtype=torch.long, device=device)
    broadcast(pg, version, root=0)
    return receive_buckets(pg, meta, bucket_bytes, device), int(version.item())


def refresh_lagging_engine(actor: Any, residency: Any, k: int) -> dict[str, float]:
    """Weight sync when the generator lives in the trainer's process (the local trainer and
    a colocated rank's ``sync_weights`` stage, after the step's update): the engine sharing
    the trainer's module only takes its version; an engine with weights of its own (a
    lagging torch copy, vLLM) gets the trainer's weights when the next step (trained at the
    trainer's version ``v``) would not be within the bound from the engine's version
    (:func:`rpeg.runtime.step.staleness.within_bound`). Returns the sync's metrics."""
    from rpeg.runtime.engines.torch_engine import TorchEngine

    eng = actor.engine
    if isinstance(eng, TorchEngine) and eng.model is actor.lm:
        eng.policy_version = actor.policy_version
        return {}
    if within_bound(int(actor.policy_version), int(eng.policy_version), k):
        return {}
    t0 = time.perf_counter()
    residency.before_update()
    load_engine_from_actor(eng, actor)
    residency.after_update()
    out = {"weight_sync_s": time.perf_counter() - t0}
    moved = getattr(eng, "last_update", None)  # vLLM: bytes sent to its workers
    if moved is not None:
        out["weight_sync_bytes"] = float(moved.nbytes)
    return out


def load_engine_from_actor(eng: Any, actor: Any) -> None:
    """An engine holding weights of its own takes the actor's current ones, one full tensor
    at a time from the trainer's (sharded or whole) weights (``actor.weight_source``): a torch
    copy keeps each tensor's slice, vLLM receives them bucket by bucket in its dtype (on GPU
    by CUDA IPC from device memory when its workers share the GPU). Never a whole host copy.
    Sharded trainer: a collective every rank of the group runs."""
    from rpeg.runtime.engines.torch_engine import TorchEngine

    if isinstance(eng, TorchEngine):
        eng.update_from(actor.weight_source(), actor.policy_version)
    else:
        eng.update_from(actor.weight_source(), actor.policy_version, actor.device)
