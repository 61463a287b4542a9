"""Bucketed weight sync: the trainer's state dict as fixed-size flat buckets.

``pack`` flattens tensors (grouped by dtype, in name order) into buckets of at most
``bucket_bytes`` (a tensor larger than a bucket gets a bucket of its own); ``unpack`` restores
them bit-exactly. Each bucket is one contiguous tensor, so it moves as one broadcast over the
weight-sync process group (trainer rank 0 -> every generator rank: :func:`broadcast_weights`
/ :func:`receive_weights`, called by ``RankActor.send_weights`` / ``recv_weights``) instead of
one message per parameter. ``layout`` gives a receiver the same
buckets, empty, from its own model's full shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_BUCKET_BYTES = 4 << 20


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


def _groups(meta: dict[str, tuple[tuple[int, ...], torch.dtype]], bucket_bytes: int):
    """[(dtype, [names])] per bucket: names by dtype (first seen in name order), then name."""
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name in sorted(meta):
        by_dtype.setdefault(meta[name][1], []).append(name)
    out = []
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


def _entries(meta, names) -> tuple[list[BucketEntry], int]:
    entries, off = [], 0
    for n in names:
        k = _numel(meta[n][0])
        entries.append(BucketEntry(n, tuple(meta[n][0]), off, k))
        off += k
    return entries, off


def pack(
    tensors: dict[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[Bucket]:
    meta = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
    out: list[Bucket] = []
    for dtype, names in _groups(meta, bucket_bytes):
        entries, _ = _entries(meta, names)
        flat = torch.cat([tensors[n].detach().reshape(-1).to("cpu") for n in names])
        out.append(Bucket(dtype, entries, flat))
    return out


def layout(
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[Bucket]:
    """Empty buckets with the layout :func:`pack` gives tensors of these shapes and dtypes (the
    receive buffers of a broadcast: a receiver knows its own model's full shapes)."""
    out = []
    for dtype, names in _groups(meta, bucket_bytes):
        entries, n = _entries(meta, names)
        out.append(Bucket(dtype, entries, torch.empty(n, dtype=dtype)))
    return out


def unpack(buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    out = {}
    for b in buckets:
        for e in b.entries:
            out[e.name] = b.flat[e.offset : e.offset + e.numel].view(e.shape).clone()
    return out


def total_bytes(buckets: list[Bucket]) -> int:
    return sum(b.nbytes for b in buckets)


def broadcast_weights(pg, full: dict[str, torch.Tensor], version: int, bucket_bytes: int, device):
    """Sender side of a sync over the weight-sync group ``pg`` (rank 0): the policy version,
    then ``full`` packed in ``bucket_bytes`` buckets, one broadcast each, from ``device``.
    -> (bytes sent, buckets)."""
    from rpeg.runtime.actors.rendezvous import broadcast

    broadcast(pg, torch.tensor([version], dtype=torch.long).to(device))
    buckets = pack(full, bucket_bytes)
    for b in buckets:
        broadcast(pg, b.flat.to(device))
    return total_bytes(buckets), len(buckets)


def receive_weights(pg, meta, bucket_bytes: int, device) -> tuple[dict[str, torch.Tensor], int]:
    """Receiver side of :func:`broadcast_weights`: the buckets laid out from this rank's own
    full shapes ``meta`` (same names, dtypes and order as the sender's) -> (weights on the
    CPU, policy version)."""
    from rpeg.runtime.actors.rendezvous import broadcast

    version = torch.zeros(1, dtype=torch.long, device=device)
    broadcast(pg, version, root=0)
    buckets = layout(meta, bucket_bytes)
    for b in buckets:
        flat = b.flat.to(device)
        broadcast(pg, flat, root=0)
        b.flat = flat.cpu() if flat.device.type != "cpu" else flat
    return unpack(buckets), int(version.item())
