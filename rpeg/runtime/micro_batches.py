"""Cutting a (mini-)batch into micro-batches: a fixed number of samples, or a token budget.

* Fixed: ``micro_batch_size`` samples each, in order.
* Token budget (``max_tokens_per_micro_batch``, verl's ``ppo_max_token_len_per_gpu`` /
  NeMo-RL's dynamic batching): samples sorted by length, longest first, are packed while
  the micro-batch's size stays within the budget; a sample over the budget on its own forms
  its own micro-batch. The size is what the pass computes: padded, ``rows * (longest
  prompt + longest response)``; packed (the unit's ``seq_packing``: the rows run end to end
  without padding, rpeg.runtime.packing), the rows' own tokens.

Both numbers are the compiled unit's (:class:`rpeg.compile.step.TaskSpec`'s
``micro_batch_size`` and ``max_tokens_per_micro_batch``): the stage loop
(:mod:`rpeg.runtime.stage_loop`) hands the unit it runs to its roles
(:func:`unit_micro_batches`: ``role.micro_batching``) and every forward or training pass
cuts its batch with :func:`micro_batches`, which reads the unit's fields (a role used on
its own, outside a unit, is cut as its workload config says). No config is copied.

Every forward or backward of a sharded (FSDP / TP) or data-parallel model is a collective, so
the ranks of a group must run the same number of micro-batches. :func:`plan_micro_batches`
agrees on the largest count over the group (``RankReduce.max``) and re-partitions a rank
that needs fewer into that many balanced parts (longest-processing-time greedy); a rank with
fewer samples than parts gets empty parts, which the caller runs as a zero-weight dummy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch

from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import LOCAL, RankReduce


class MicroBatching(Protocol):
    """What cuts a role's passes into micro-batches: the compiled unit the role runs
    (:class:`rpeg.compile.step.TaskSpec`), or, for a role used on its own, its
    :class:`rpeg.config.WorkloadConfig` (the same two fields)."""

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def max_tokens_per_micro_batch(self) -> int | None: ...

    @property
    def seq_packing(self) -> bool: ...


def _lengths(batch: RolloutBatch) -> tuple[list[int], list[int]]:
    """Each row's prompt and response tokens as a pass computes them (a multi-turn
    transcript's: every token it attends to, the environment's included)."""
    r = batch.response_mask if batch.response_attention is None else batch.response_attention
    return batch.prompt_mask.sum(-1).tolist(), r.sum(-1).tolist()


def padded_tokens(batch: RolloutBatch, index: list[int]) -> int:
    """Tokens of the micro-batch ``index`` once padded to its longest prompt and response."""
    if not index:
        return 0
    p, r = _lengths(batch)
    return len(index) * (max(p[i] for i in index) + max(r[i] for i in index))


def _size(rows: int, mp: int, mr: int, tokens: int, packed: bool) -> int:
    """What a micro-batch of ``rows`` rows computes: their ``tokens`` packed, else every row
    padded to the longest prompt ``mp`` and response ``mr``."""
    return tokens if packed else rows * (mp + mr)


def _by_budget(p: list[int], r: list[int], budget: int, packed: bool = False) -> list[list[int]]:
    order = sorted(range(len(p)), key=lambda i: (-(p[i] + r[i]), i))
    parts: list[list[int]] = []
    cur: list[int] = []
    mp = mr = tok = 0
    for i in order:
        np_, nr, nt = max(mp, p[i]), max(mr, r[i]), tok + p[i] + r[i]
        if cur and _size(len(cur) + 1, np_, nr, nt, packed) > budget:
            parts.append(cur)
            cur, np_, nr, nt = [], p[i], r[i], p[i] + r[i]
        cur.append(i)
        mp, mr, tok = np_, nr, nt
    if cur:
        parts.append(cur)
    return parts


def _balanced(p: list[int], r: list[int], k: int, packed: bool = False) -> list[list[int]]:
    """``k`` parts of near-equal size (:func:`_size`; longest first, each to the part it
    grows least)."""
    order = sorted(range(len(p)), key=lambda i: (-(p[i] + r[i]), i))
    parts: list[list[int]] = [[] for _ in range(k)]
    shape = [(0, 0)] * k
    tokens = [0] * k
    for i in order:

        def grown(j: int, i: int = i) -> tuple[int, int]:
            mp, mr = max(shape[j][0], p[i]), max(shape[j][1], r[i])
            return _size(len(parts[j]) + 1, mp, mr, tokens[j] + p[i] + r[i], packed), j

        j = min(range(k), key=grown)
        parts[j].append(i)
        shape[j] = (max(shape[j][0], p[i]), max(shape[j][1], r[i]))
        tokens[j] += p[i] + r[i]
    return parts


def plan_micro_batches(
    batch: RolloutBatch,
    micro_batch_size: int,
    max_tokens: int | None = None,
    reduce: RankReduce = LOCAL,
    packed: bool = False,
) -> list[list[int]]:
    """Row indices of each micro-batch of ``batch`` (see the module doc; ``packed``: the
    budget counts the rows' own tokens). Every rank of ``reduce``'s group gets the same
    number of lists; some may be empty."""
    n = batch.size
    if max_tokens:
        p, r = _lengths(batch)
        parts = _by_budget(p, r, max_tokens, packed)
    else:
        parts = [
            list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)
        ]
    k = int(reduce.max(torch.tensor([len(parts)], dtype=torch.long))[0])
    if k == len(parts):
        return parts
    if max_tokens:
        p, r = _lengths(batch)
        return _balanced(p, r, k, packed)
    return [c.tolist() for c in torch.tensor_split(torch.arange(n), k)]


def micro_batches(batch: RolloutBatch, role: Any) -> list[tuple[list[int], RolloutBatch, bool]]:
    """``(rows, micro-batch, real)`` of ``batch`` for a pass of ``role``: cut by the compiled
    unit the role runs (``role.micro_batching.micro_batch_size`` samples, or its token budget
    ``max_tokens_per_micro_batch``) and agreed over ``role.reduce``'s group
    (:func:`plan_micro_batches`); an empty part becomes the batch's first row marked
    ``real=False``: run for the collectives, weighted 0."""
    cut: MicroBatching = role.micro_batching
    parts = plan_micro_batches(
        batch,
        cut.micro_batch_size,
        cut.max_tokens_per_micro_batch or None,
        role.reduce,
        cut.seq_packing,
    )
    return [(ix, batch.select(ix), True) if ix else ([], batch.select([0]), False) for ix in parts]


@contextlib.contextmanager
def unit_micro_batches(workers: Iterable[Any], unit: MicroBatching) -> Iterator[None]:
    """While inside, every worker's (role's) passes are cut as the compiled ``unit`` says
    (``role.micro_batching`` is the unit itself, read by :func:`micro_batches`); each
    role's own comes back on exit. A worker that is None or has none is left as is."""
    saved = []
    for wk in workers:
        if wk is not None and getattr(wk, "micro_batching", None) is not None:
            saved.append((wk, wk.micro_batching))
            wk.micro_batching = unit
    try:
        yield
    finally:
        for wk, cut in saved:
            wk.micro_batching = cut
