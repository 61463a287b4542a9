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
    whole = minibatch_rows(_batch(list(range(8))), 4, torch.Generator().manual_seed(3), LOCAL, 1)
    # rank 0 holds rollout rows 0-3, rank 1 rows 4-7 (stored as rows 0-3 of its batch)
    r0 = minibatch_rows(_batch([0, 1, 2, 3]), 4, torch.Generator().manual_seed(3), _Group(8), 1)
    r1 = minibatch_rows(_batch([4, 5, 6, 7]), 4, torch.Generator().manual_seed(3), _Group(8), 1)
    assert len(whole) == len(r0) == len(r1) == 4
    for w, a, b in zip(whole, r0, r1, strict=True):
        assert sorted(w) == sorted(a + [4 + i for i in b])


def test_the_single_process_split_is_unchanged():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    b = _batch(list(range(10)))
    order = torch.randperm(10, generator=g2)
    want = [c.tolist() for c in torch.tensor_split(order, 3)]
    assert minibatch_rows(b, 3, g1, LOCAL, 1) == want
    assert minibatch_rows(b, 3, None, LOCAL, 1) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_filtered_rows_leave_gaps_not_shifts():
    # rows 2 and 3 were filtered out (a DAPO group): the others keep their chunks
    b = _batch([0, 1, 4, 5])
    got = minibatch_rows(b, 3, None, LOCAL, 1)  # positions 0..5 in chunks [0,1] [2,3] [4,5]
    assert got == [[0, 1], [], [2, 3]]


def test_rows_without_positions_or_with_repeats_split_on_their_own():
    g = torch.Generator().manual_seed(1)
    for index in (None, [0, 1, 0, 1]):  # repeats: rows of two steps' rollouts
        rows = minibatch_rows(_batch(index), 2, g, _Group(100), 1)
        assert sorted(r for m in rows for r in m) == [0, 1, 2, 3] and len(rows) == 2


def test_chunks_are_stratified_by_prompt_and_ranks_get_equal_shares():
    """K samples per prompt: every chunk takes K / n samples of every prompt (a partition of
    the rollout), so two ranks holding 8 prompts each get 16 rows of every 32-row chunk -- a
    simple random chunk gave them anything from 8 to 24 -- and the layouts still agree."""
    from rpeg.runtime.batch import chunk_order

    k, prompts, n = 8, 16, 4
    for seed in range(5):
        chunks = chunk_order(prompts * k, n, torch.Generator().manual_seed(seed), k)
        assert sorted(torch.cat(chunks).tolist()) == list(range(prompts * k))
        for c in chunks:
            assert torch.bincount(c // k, minlength=prompts).tolist() == [k // n] * prompts
        g = torch.Generator().manual_seed(seed)
        whole = minibatch_rows(_batch(list(range(128))), n, g, LOCAL, k)
        r0 = minibatch_rows(
            _batch(list(range(64))), n, torch.Generator().manual_seed(seed), _Group(128), k
        )
        r1 = minibatch_rows(
            _batch(list(range(64, 128))), n, torch.Generator().manual_seed(seed), _Group(128), k
        )
        assert [len(a) for a in r0] == [len(b) for b in r1] == [16] * n
        for w, a, b in zip(whole, r0, r1, strict=True):
            assert sorted(w) == sorted(a + [64 + i for i in b])
    # K not a multiple of n: rounds cut mid-way, still a partition, shares within one row
    chunks = chunk_order(5 * 3, 2, torch.Generator().manual_seed(0), 3)
    assert sorted(torch.cat(chunks).tolist()) == list(range(15))
    for c in chunks:
        counts = torch.bincount(c // 3, minlength=5)
        assert int(counts.max() - counts.min()) <= 1


def test_stratifying_draws_what_the_plain_permutation_draws():
    """The stratified order is a reordering of the same permutation: the generator is left
    where an unstratified cut leaves it (later draws -- the next epoch's chunks -- agree)."""
    from rpeg.runtime.batch import chunk_order

    ga, gb = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    chunk_order(24, 3, ga, 4)
    chunk_order(24, 3, gb, 1)
    assert torch.equal(torch.randperm(24, generator=ga), torch.randperm(24, generator=gb))


def test_a_filtered_group_leaves_its_slots_empty_in_the_stratified_chunks():
    """DAPO drops whole groups: their positions are gaps, the other prompts keep K/n samples in
    every chunk, and every surviving row is in exactly one chunk."""
    k, n = 4, 2
    kept = [p for p in range(16) if p // k != 1]  # prompt 1 (positions 4-7) filtered out
    got = minibatch_rows(_batch(kept), n, torch.Generator().manual_seed(2), LOCAL, k)
    assert sorted(i for c in got for i in c) == list(range(len(kept)))
    for c in got:
        prompts = [kept[i] // k for i in c]
        assert sorted(prompts) == [0, 0, 2, 2, 3, 3]
