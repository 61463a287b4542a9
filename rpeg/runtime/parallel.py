"""How a data-parallel rank combines batch statistics with its peers.

The engine's math is written for one process. Under data parallelism a few statistics span
the whole batch, not a rank's shard: batch-wide advantage whitening (REINFORCE++, PPO) and the
token/sequence count that normalizes a mini-batch's loss. Engine functions take a
:class:`RankReduce` for those; the default, :data:`LOCAL`, is one process. The distributed
runtime passes one that all-reduces over the group's process group, so no engine code knows
about torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass(frozen=True)
class RankReduce:
    """``sum(t)``: elementwise sum of ``t`` over the ranks of the data-parallel group (every
    rank calls it in the same order); ``world_size``: ranks in the group."""

    world_size: int = 1
    sum: Callable[[torch.Tensor], torch.Tensor] = field(default=_identity)


LOCAL = RankReduce()


def process_group_reduce(group=None) -> RankReduce:
    """A :class:`RankReduce` over a ``torch.distributed`` process group (default: world)."""
    import torch.distributed as dist

    def _sum(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t

    return RankReduce(world_size=dist.get_world_size(group), sum=_sum)
