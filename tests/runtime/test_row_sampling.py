"""Per-row sampling streams (rpeg.runtime.engines.row_sampling): exact inverse-CDF draws,
never a filtered token, independent of how a batch is split."""

from __future__ import annotations

import pytest
import torch

from rpeg.runtime.engines.row_sampling import (
    ROWS_PER_STEP,
    rollout_seed,
    row_keys,
    row_uniforms,
    row_uniforms_block,
    sample_rows,
)


def test_inverse_cdf_on_hand_worked_rows():
    # cdf 0.25, 0.25, 0.75, 1.0 (exact in float32): token 1 has probability 0
    probs = torch.tensor([[0.25, 0.0, 0.5, 0.25]] * 5)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 1 - 2**-24])
    assert sample_rows(probs, u).tolist() == [0, 0, 2, 2, 3]


def test_unnormalised_rows_and_a_filtered_tail():
    # totals need not be 1; the last token filtered out (probability 0) is never drawn
    probs = torch.tensor([[2.0, 6.0, 0.0], [0.0, 0.0, 3.0]])
    assert sample_rows(probs, torch.tensor([0.24, 0.0])).tolist() == [0, 2]
    assert sample_rows(probs, torch.tensor([1 - 2**-24, 1 - 2**-24])).tolist() == [1, 2]


def test_u_times_total_rounding_up_to_the_total_takes_the_last_possible_token():
    # in float16, u = 1 - 2**-24 rounds to 1.0, so u * total == total: no cdf entry exceeds it
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float16)
    assert sample_rows(probs, torch.tensor([1 - 2**-24])).tolist() == [1]


def test_draws_follow_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 40_000
    keys = row_keys(12345, n)
    counts = torch.zeros(4)
    for t in range(3):  # three decode steps: each its own draw per row
        tok = sample_rows(probs.expand(n, 4), row_uniforms(keys, t))
        counts += torch.bincount(tok, minlength=4).float()
    freq = counts / (3 * n)
    # binomial std at n = 120k is <= 0.0015; 0.006 is 4 std
    assert torch.allclose(freq, probs, atol=0.006), freq


def test_uniforms_are_uniform_and_differ_across_steps_and_rows():
    keys = row_keys(rollout_seed(7, 3), 50_000)
    u0, u1 = row_uniforms(keys, 0), row_uniforms(keys, 1)
    assert float(u0.min()) >= 0.0 and float(u0.max()) < 1.0
    hist = torch.histc(u0, bins=10, min=0.0, max=1.0) / u0.numel()
    assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.01)
    assert abs(float(torch.corrcoef(torch.stack([u0, u1]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([u0[:-1], u0[1:]]))[0, 1])) < 0.02
    assert len(set(keys.tolist())) == keys.numel()  # the mixer is a bijection of 32 bits


def test_a_batch_split_anywhere_draws_what_the_whole_batch_draws():
    seed = rollout_seed(0, 5)
    whole = row_uniforms(row_keys(seed, 24), 4)
    parts = [row_uniforms(row_keys(seed + a, b - a), 4) for a, b in ((0, 5), (5, 6), (6, 24))]
    assert torch.equal(torch.cat(parts), whole)


def test_a_block_of_steps_draws_each_step_s_uniforms():
    # the decode loop hashes 64 steps at once (TorchEngine): the same bits as step by step
    keys = row_keys([0, 1, 2**40 + 3, 2**62 - 1], 4)
    block = row_uniforms_block(keys, 5, 70)
    assert block.shape == (70, 4)
    assert torch.equal(block, torch.stack([row_uniforms(keys, 5 + i) for i in range(70)]))


def test_rollout_seeds_of_steps_and_runs_do_not_overlap():
    assert rollout_seed(0, 1) - rollout_seed(0, 0) == ROWS_PER_STEP
    assert rollout_seed(0, 2, 10) == rollout_seed(0, 2) + 10
    assert rollout_seed(1, 0) != rollout_seed(0, 0)
    assert 0 <= rollout_seed(10**12, 10**9) < 2**62
    with pytest.raises(ValueError, match="first_row"):
        rollout_seed(0, 0, ROWS_PER_STEP)


def test_large_seeds_stay_in_int64_range():
    keys = row_keys(2**62 - 3, 8)  # wraps within the seed space, no overflow
    assert keys.dtype == torch.int64 and int(keys.min()) >= 0 and int(keys.max()) < 2**32
    u = row_uniforms(keys, 10**9)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
