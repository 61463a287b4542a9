"""Advantage estimators against values worked out by hand."""

import math

import pytest
import torch

from rpeg.runtime.algorithms import (
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)


def test_grpo_group_mean_std():
    # group 1: r = [1, 0, 0, 1] -> mean 0.5, unbiased std = sqrt((4 * 0.25) / 3) = sqrt(1/3) = 0.57735
    #   A = (+-0.5) / 0.57735 = +-0.866025
    # group 2: r = [2, 2, 2, 2] -> mean 2, std 0 -> A = 0 / (0 + eps) = 0
    r = torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2])
    a = grpo_advantages(r, 4)
    s = 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(a, torch.tensor([s, -s, -s, s, 0, 0, 0, 0]), atol=1e-5, rtol=0)


def test_dr_grpo_no_std():
    # r = [3, 1] -> mean 2 -> A = [1, -1]; r = [0, 0, ...] second group: [5, 1] -> mean 3 -> [2, -2]
    r = torch.tensor([3.0, 1, 5, 1])
    torch.testing.assert_close(
        grpo_advantages(r, 2, normalize_std=False), torch.tensor([1.0, -1, 2, -2])
    )


def test_rloo():
    # r = [1, 0, 0, 1] (K = 4): baseline_i = (sum - r_i) / 3 = (2 - r_i) / 3
    #   i=0: 1 - 1/3 = 2/3 ; i=1: 0 - 2/3 = -2/3
    r = torch.tensor([1.0, 0, 0, 1])
    torch.testing.assert_close(rloo_advantages(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    # K = 3: r = [3, 0, 0] -> A_0 = 3 - 0 = 3 ; A_1 = 0 - (3 + 0)/2 = -1.5
    torch.testing.assert_close(
        rloo_advantages(torch.tensor([3.0, 0, 0]), 3), torch.tensor([3.0, -1.5, -1.5])
    )
    with pytest.raises(ValueError):
        rloo_advantages(torch.tensor([1.0]), 1)


def test_outcome_token_rewards_on_last_token():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = outcome_token_rewards(torch.tensor([2.0, -1.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0, 2], [-1, 0, 0]]))


def test_reinforce_pp_batch_normalized():
    # rewards [1, 0]; mask rows of length 2 and 1; gamma 1, no KL
    # returns: row0 = [1, 1]; row1 = [0, (pad)]
    # valid tokens {1, 1, 0}: mean 2/3, biased var = (2*(1/3)^2 + (2/3)^2)/3 = (2/9 + 4/9)/3 = 2/9
    # A = (G - 2/3) / sqrt(2/9) -> row0: (1/3)/0.471405 = 0.707107 ; row1: (-2/3)/0.471405 = -1.414214
    mask = torch.tensor([[1, 1], [1, 0]])
    a = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask)
    torch.testing.assert_close(
        a, torch.tensor([[0.707107, 0.707107], [-1.414214, 0.0]]), atol=1e-5, rtol=0
    )


def test_reinforce_pp_with_kl_in_reward():
    # one row, reward 1, kl = [0.5, 0.5], coef 0.2 -> token rewards [-0.1, 1 - 0.1] = [-0.1, 0.9]
    # returns: G_1 = 0.9, G_0 = -0.1 + 0.9 = 0.8 ; second row reward 0 kl 0 -> [0, 0]
    # tokens {0.8, 0.9, 0, 0}: mean 0.425, var = (0.375^2 + 0.475^2 + 2*0.425^2)/4 = (0.140625+0.225625+0.36125)/4 = 0.181875
    mask = torch.ones(2, 2, dtype=torch.long)
    kl = torch.tensor([[0.5, 0.5], [0.0, 0.0]])
    a = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, kl=kl, kl_coef=0.2)
    sd = math.sqrt(0.181875)
    exp = torch.tensor([[0.375 / sd, 0.475 / sd], [-0.425 / sd, -0.425 / sd]])
    torch.testing.assert_close(a, exp, atol=1e-5, rtol=0)


def test_gae_hand_values():
    # T = 3, rewards only at the end: r = [0, 0, 1]; V = [0.5, 0.6, 0.7]; gamma = 1, lam = 0.5
    # deltas: d2 = 1 + 0 - 0.7 = 0.3 ; d1 = 0 + 0.7 - 0.6 = 0.1 ; d0 = 0 + 0.6 - 0.5 = 0.1
    # A2 = 0.3 ; A1 = 0.1 + 0.5 * 0.3 = 0.25 ; A0 = 0.1 + 0.5 * 0.25 = 0.225
    # returns = A + V = [0.725, 0.85, 1.0]
    r = torch.tensor([[0.0, 0, 1]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = gae_advantages(r, v, m, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0]]))


def test_gae_discount_and_padding():
    # row of length 2 padded to 3; r = [0, 1], V = [0.2, 0.4], gamma 0.9, lam 1
    # d1 = 1 - 0.4 = 0.6 ; d0 = 0 + 0.9*0.4 - 0.2 = 0.16 ; A1 = 0.6 ; A0 = 0.16 + 0.9*0.6 = 0.7
    r = torch.tensor([[0.0, 1.0, 0.0]])
    v = torch.tensor([[0.2, 0.4, 9.9]])  # garbage on the padding must not leak in
    m = torch.tensor([[1, 1, 0]])
    adv, ret = gae_advantages(r, v, m, gamma=0.9, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.7, 0.6, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.9, 1.0, 0.0]]))


def test_masked_whiten():
    # values {1, 3} (the 100 is masked): mean 2, var 1 -> [-1, 1, 0]
    out = masked_whiten(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 0.0]), atol=1e-4, rtol=0)
