"""Bucketed weight sync: the trainer's state dict as fixed-size flat buckets.

``pack`` flattens tensors (grouped by dtype, in name order) into buckets of at most
``bucket_bytes`` (a tensor larger than a bucket gets a bucket of its own); ``unpack`` restores
them bit-exactly. Each bucket is one contiguous tensor, so it moves as one message (or one
broadcast in a process group) instead of one per parameter.
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


def pack(
    tensors: dict[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[Bucket]:
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name in sorted(tensors):
        by_dtype.setdefault(tensors[name].dtype, []).append(name)
    out: list[Bucket] = []
    for dtype, names in by_dtype.items():
        elem = torch.empty((), dtype=dtype).element_size()
        cap = max(1, bucket_bytes // elem)
        cur: list[str] = []
        size = 0
        groups: list[list[str]] = []
        for n in names:
            k = tensors[n].numel()
            if cur and size + k > cap:
                groups.append(cur)
                cur, size = [], 0
            cur.append(n)
            size += k
        if cur:
            groups.append(cur)
        for g in groups:
            entries, off = [], 0
            for n in g:
                t = tensors[n]
                entries.append(BucketEntry(n, tuple(t.shape), off, t.numel()))
                off += t.numel()
            flat = (
                torch.cat([tensors[n].detach().reshape(-1).to("cpu") for n in g])
                if g
                else torch.empty(0)
            )
            out.append(Bucket(dtype, entries, flat))
    return out


def unpack(buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    out = {}
    for b in buckets:
        for e in b.entries:
            out[e.name] = b.flat[e.offset : e.offset + e.numel].view(e.shape).clone()
    return out


def total_bytes(buckets: list[Bucket]) -> int:
    return sum(b.nbytes for b in buckets)
