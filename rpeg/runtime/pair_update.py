"""A same-host data-parallel pair's optimizer update split in halves.

Two replicas of a role (``dp=2``, no FSDP, no tensor or expert split) on one host hold the
same parameters and, after the gradient sum, the same gradients; each then ran the gradient
norm, the clipping and AdamW over every parameter -- the same work twice, on the two cores
the pair has. Here the update is partitioned as ZeRO stage 1 partitions it (Rajbhandari et
al. 2020, arXiv:1910.02054; Megatron-LM's distributed optimizer): the parameters laid end to
end are cut at their midpoint element, rank 0 owns the first half and rank 1 the second
(a tensor may straddle the cut: each rank owns its elements of it), and per optimizer step:

1. **reduce-scatter** (:meth:`PairSplit.reduce_scatter`): each rank sends the peer's half of
   its gradients and sums its own half (the mean: both halves pre-scaled by ``1/2``, as the
   whole-list sum did: the same bits);
2. **norm and clip over the own half** (:meth:`PairSplit.clip`): one float64 scalar
   exchanged, the same total on both ranks;
3. **AdamW over the own half** (``_AdamW.step(owned=...)``: the fused update on 1-D views of
   the owned elements; the other half's ``step`` counters advance with it);
4. **all-gather** (:meth:`PairSplit.gather_params`): each rank sends its updated half of the
   weights and takes the peer's.

The bytes the pair moves stay those of the whole-list sum (half the gradients and half the
weights each way instead of all the gradients), while the norm, the clip and AdamW -- about
a fifth of rpeg-tiny's dp=2 train stage -- run once per element instead of twice. Each rank's
moments of the peer's half are not updated; before anything reads them (a checkpoint),
:meth:`PairSplit.consolidate` copies the owner's half over, so a checkpoint is the one the
unsplit update writes. Memory is unchanged (both ranks keep the whole optimizer state): this
is a split of the work, not of the state -- what the planner prices for these replicas
(rpeg.perf.passes.state_memory).

Both ranks must call every method in the same order with the same parameters holding
gradients (the contract of a collective), over the pair channel
(:mod:`rpeg.runtime.pair_channel`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from rpeg.runtime.pair_channel import PairChannel

#: AdamW's per-parameter state tensors a checkpoint holds (``max_exp_avg_sq``: amsgrad)
MOMENT_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class PairSplit:
    """The split of ``params`` (every trainable replicated parameter, in the same order on
    both ranks) between group rank ``me`` (0 or 1) and its peer over ``channel``."""

    def __init__(self, params: Iterable[nn.Parameter], channel: PairChannel, me: int):
        if me not in (0, 1):
            raise ValueError(f"PairSplit: me must be 0 or 1, got {me}")
        self.params = list(params)
        self.channel = channel
        self.me = me
        total = sum(p.numel() for p in self.params)
        cut = (total + 1) // 2
        lo, hi = (0, cut) if me == 0 else (cut, total)
        # per parameter: (first, stop) of its own elements, or None (all the peer's)
        self._own: dict[int, tuple[int, int] | None] = {}
        at = 0
        for p in self.params:
            a, b = max(lo, at), min(hi, at + p.numel())
            self._own[id(p)] = (a - at, b - at) if a < b else None
            at += p.numel()

    @classmethod
    def usable(cls, params: list[nn.Parameter]) -> bool:
        """Whether ``params`` can be split: plain contiguous CPU tensors of one dtype."""
        from torch.distributed.tensor import DTensor

        if not params:
            return False
        dtype = params[0].dtype
        return all(
            not isinstance(p, DTensor)
            and p.device.type == "cpu"
            and p.dtype == dtype
            and p.is_contiguous()
            for p in params
        )

    def owned(self, p: torch.Tensor) -> tuple[int, int] | None:
        """This rank's elements ``(first, stop)`` of ``p`` (flattened), or None."""
        return self._own.get(id(p))

    def covers(self, p: torch.Tensor) -> bool:
        return id(p) in self._own

    # --- the halves as 1-D views --------------------------------------------------------
    def _halves(self, tensors: list[tuple[nn.Parameter, torch.Tensor]]):
        """(own pieces, the peer's pieces) of ``tensors`` (each a parameter's tensor of its
        shape: the weight, its gradient or a moment), in parameter order."""
        own, theirs = [], []
        for p, t in tensors:
            flat = t.detach().view(-1)
            span = self._own[id(p)]
            if span is None:
                theirs.append(flat)
                continue
            a, b = span
            if a > 0:
                theirs.append(flat[:a])
            own.append(flat[a:b])
            if b < flat.numel():
                theirs.append(flat[b:])
        return own, theirs

    def _grads(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        return [(p, p.grad) for p in self.params if p.grad is not None]

    # --- the update -----------------------------------------------------------------------
    def reduce_scatter(self, divide: float = 2.0) -> None:
        """This rank's half of every gradient := the pair's sum / ``divide`` (the mean at 2;
        exact for a power of two: :meth:`PairChannel.sum_pieces_`). The peer's half of this
        rank's gradients is left as it was (not summed)."""
        own, theirs = self._halves(self._grads())
        self.channel.sum_pieces_(theirs, own, divide)

    def clip(self, max_norm: float) -> float:
        """The global L2 norm of the summed gradients (this half's squares + the peer's, in
        float64: the same total on both ranks), then this half scaled by ``min(1, max_norm /
        (norm + 1e-6))`` (``clip_grad_norm_``'s rule)."""
        own, _ = self._halves(self._grads())
        sq = torch.zeros(1, dtype=torch.float64)
        if own:
            sq += torch.stack(torch._foreach_norm(own)).double().pow(2).sum()
        total = float((sq + self.channel.exchange(sq)).sqrt())
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0 and own and math.isfinite(total):
            torch._foreach_mul_(own, coef)
        return total

    def step(self, optimizer) -> None:
        """AdamW over this rank's half (``optimizer``: :func:`rpeg.runtime.updates.adamw`),
        then the halves of the weights swapped: both ranks hold the updated weights."""
        optimizer.step(owned=self)
        self.gather_params()

    def gather_params(self) -> None:
        """Send this rank's half of the weights, take the peer's half."""
        own, theirs = self._halves([(p, p) for p in self.params])
        with torch.no_grad():
            self.channel.swap_pieces(own, theirs)

    def consolidate(self, optimizer) -> None:
        """Each rank's moments of the peer's half := the peer's (its owner's), so both ranks
        hold the state an unsplit update would have (before a checkpoint reads it)."""
        for key in MOMENT_KEYS:
            held = [
                (p, optimizer.state[p][key])
                for p in self.params
                if p in optimizer.state and key in optimizer.state[p]
            ]
            if held:
                own, theirs = self._halves(held)
                self.channel.swap_pieces(own, theirs)
