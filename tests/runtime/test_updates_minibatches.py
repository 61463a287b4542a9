"""Mini-batches as a partition of the step's rollout (rpeg.runtime.updates.minibatch_rows)."""

from __future__ import annotations

import torch

from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import LOCAL
from rpeg.runtime.updates import minibatch_rows


class _Group:
    """A stand-in for a data-parallel group whose other ranks hold rows up to ``rows``."""

    world_size = 2

    def __init__(self, rows: int):
        self.rows = rows

    def max(self, t):
        return torch.maximum(t, torch.tensor([self.rows]))


def _batch(index, b=4):
    b = b if index is None else len(index)
    return RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long),
        prompt_mask=torch.ones(b, 2, dtype=torch.long),
        response_ids=torch.ones(b, 3, dtype=torch.long),
        response_mask=torch.ones(b, 3, dtype=torch.long),
        sample_logprobs=torch.zeros(b, 3),
        policy_version=torch.zeros(b, dtype=torch.long),
        group_ids=torch.arange(b),
        sample_index=None if index is None else torch.tensor(index),
    )


def test_each_rank_takes_its_rows_of_the_whole_rollouts_chunks():
    whole = minibatch_rows(_batch(list(range(8))), 4, torch.Generator().manual_seed(3), LOCAL)
    # rank 0 holds rollout rows 0-3, rank 1 rows 4-7 (stored as rows 0-3 of its batch)
    r0 = minibatch_rows(_batch([0, 1, 2, 3]), 4, torch.Generator().manual_seed(3), _Group(8))
    r1 = minibatch_rows(_batch([4, 5, 6, 7]), 4, torch.Generator().manual_seed(3), _Group(8))
    assert len(whole) == len(r0) == len(r1) == 4
    for w, a, b in zip(whole, r0, r1, strict=True):
        assert sorted(w) == sorted(a + [4 + i for i in b])


def test_the_single_process_split_is_unchanged():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    b = _batch(list(range(10)))
    order = torch.randperm(10, generator=g2)
    want = [c.tolist() for c in torch.tensor_split(order, 3)]
    assert minibatch_rows(b, 3, g1, LOCAL) == want
    assert minibatch_rows(b, 3, None, LOCAL) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_filtered_rows_leave_gaps_not_shifts():
    # rows 2 and 3 were filtered out (a DAPO group): the others keep their chunks
    b = _batch([0, 1, 4, 5])
    got = minibatch_rows(b, 3, None, LOCAL)  # positions 0..5 in chunks [0,1] [2,3] [4,5]
    assert got == [[0, 1], [], [2, 3]]


def test_rows_without_positions_or_with_repeats_split_on_their_own():
    g = torch.Generator().manual_seed(1)
    for index in (None, [0, 1, 0, 1]):  # repeats: rows of two steps' rollouts
        rows = minibatch_rows(_batch(index), 2, g, _Group(100))
        assert sorted(r for m in rows for r in m) == [0, 1, 2, 3] and len(rows) == 2
