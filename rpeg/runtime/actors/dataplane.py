"""Batches move actor to actor; the driver plans the moves from sizes alone.

A step's batch is a sequence of rows (samples, prompt groups contiguous, in prompt order).
Ranks of a group with data layout ``(dp, tp)`` hold it sharded by data-parallel index
(rank ``r`` is dp index ``r // tp``, :mod:`rpeg.runtime.sharding`): dp index ``j`` holds the
contiguous global rows ``[offset_j, offset_j + sizes[j])``; the ``tp`` ranks of one dp index
hold the same rows. :class:`Holding` records that (metadata: group, dp, tp, sizes) and is all
the driver keeps of a batch; :func:`plan_pull` turns "group B's ranks need the rows group A
holds" into, per consumer rank, a list of (producer rank, local start, local end) slices that
the consumer fetches itself (``RankActor.pull`` -> the producers' ``rows``). Tensors never
pass through the flow process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpeg.runtime.batch import RolloutBatch


@dataclass(frozen=True)
class Holding:
    """Where the rows of one step's batch live: ``group``'s ranks at layout (dp, tp)."""

    group: str
    dp: int
    tp: int
    sizes: tuple[int, ...]  # rows per dp index

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def ranges(self) -> list[tuple[int, int]]:
        out, a = [], 0
        for n in self.sizes:
            out.append((a, a + n))
            a += n
        return out


def shard_ranges(size: int, n: int, group_size: int) -> list[tuple[int, int]]:
    """Contiguous row ranges of ``n`` near-equal shards made of whole groups of
    ``group_size`` rows (the driver's ``shard_groups`` as ranges)."""
    if group_size <= 1 or size % group_size:
        unit, count = 1, size
    else:
        unit, count = group_size, size // group_size
    k, r = divmod(count, n)
    out, a = [], 0
    for j in range(n):
        m = (k + (1 if j < r else 0)) * unit
        out.append((a, a + m))
        a += m
    return out


def plan_pull(
    src: Holding, dst_dp: int, dst_tp: int, group_size: int
) -> tuple[list[list[tuple[int, int, int]]], tuple[int, ...]]:
    """Slices each consumer rank fetches: ``[[(producer rank, start, end), ...] per rank]``
    (local row indices of the producer), and the consumer's sizes per dp index.

    Consumer dp index ``i`` gets rows ``shard_ranges(total, dst_dp)[i]``; a slice is read from
    the producer's tp replica ``i % src.tp`` so replicas share the load."""
    want = shard_ranges(src.total, dst_dp, group_size)
    have = src.ranges()
    per_rank: list[list[tuple[int, int, int]]] = []
    for rank in range(dst_dp * dst_tp):
        i = rank // dst_tp
        a, b = want[i]
        parts = []
        for j, (s, e) in enumerate(have):
            lo, hi = max(a, s), min(b, e)
            if lo < hi:
                parts.append((j * src.tp + (i % src.tp), lo - s, hi - s))
        per_rank.append(parts)
    return per_rank, tuple(b - a for a, b in want)


def same_rows(src: Holding, dst_dp: int, group_size: int) -> bool:
    """True when a consumer at ``dst_dp`` would hold exactly the producer's rows per index."""
    return src.dp == dst_dp and tuple(
        b - a for a, b in shard_ranges(src.total, dst_dp, group_size)
    ) == tuple(src.sizes)


def tensor_bytes(obj: object) -> int:
    """Bytes of the tensors inside ``obj`` (batches, buckets, lists, dicts, tuples)."""
    import dataclasses

    import torch

    def size(o: object) -> int:
        if o is None or isinstance(o, str | int | float | bytes):  # most leaves: texts
            return 0
        if isinstance(o, torch.Tensor):
            return o.numel() * o.element_size()
        if isinstance(o, dict):
            return sum(size(v) for v in o.values())
        if isinstance(o, list | tuple):
            return sum(size(v) for v in o)
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return sum(size(getattr(o, f.name)) for f in dataclasses.fields(o))
        return 0

    return size(obj)


def concat_rows(parts: Sequence[RolloutBatch]) -> RolloutBatch:
    from rpeg.runtime.batch import RolloutBatch

    return parts[0] if len(parts) == 1 else RolloutBatch.concat(list(parts))


def merge_fields(batch: Any, parts: list[dict[str, Any]]) -> Any:
    """``batch`` with the fields of ``parts`` (row slices in order) it lacks; token fields
    padded or cut to the batch's response width."""
    if not parts:
        return batch
    import torch

    from rpeg.runtime.batch import TOKEN_FIELDS

    width = batch.response_ids.shape[1]
    new = {}
    for f in parts[0]:
        if getattr(batch, f) is not None:
            continue
        cols = []
        for p in parts:
            t = p[f]
            if f in TOKEN_FIELDS:
                t = (
                    t[:, :width]
                    if t.shape[1] >= width
                    else torch.nn.functional.pad(t, (0, width - t.shape[1]))
                )
            cols.append(t)
        new[f] = torch.cat(cols, dim=0)
    return batch.replace(**new) if new else batch
