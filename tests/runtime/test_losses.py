"""Losses against values worked out by hand."""

import math

import pytest
import torch

from rpeg.runtime.algorithms import (
    aggregate,
    correction_weights,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    token_logprobs,
    value_loss,
)

L = math.log


def test_aggregation_modes():
    # loss [[1, 2, 3], [4, 0, 0]], mask [[1,1,1],[1,0,0]]
    # token_mean = (1+2+3+4)/4 = 2.5 ; seq_mean_token_sum = (6 + 4)/2 = 5 ; seq_mean_token_mean = (2 + 4)/2 = 3
    loss = torch.tensor([[1.0, 2, 3], [4, 9, 9]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate(loss, m, "token_mean")) == pytest.approx(2.5)
    assert float(aggregate(loss, m, "seq_mean_token_sum")) == pytest.approx(5.0)
    assert float(aggregate(loss, m, "seq_mean_token_mean")) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        aggregate(loss, m, "bogus")


def test_policy_loss_clip_and_clip_higher():
    # tokens: ratio r = exp(logp - old)
    #  t0: r = 1.5, A = +1 -> max(-1.5, -clip(1.5)) ; clip to 1.2 (eps 0.2) -> max(-1.5, -1.2) = -1.2 (clipped)
    #  t1: r = 0.5, A = +1 -> max(-0.5, -0.8) = -0.5 (not clipped)
    #  t2: r = 0.5, A = -1 -> max(0.5, 0.8) = 0.8 (clipped)
    #  t3: r = 1.5, A = -1 -> max(1.5, 1.2) = 1.5 (not clipped)
    # token mean = (-1.2 - 0.5 + 0.8 + 1.5)/4 = 0.15 ; clip frac = 2/4
    old = torch.zeros(1, 4)
    lp = torch.tensor([[L(1.5), L(0.5), L(0.5), L(1.5)]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    m = torch.ones(1, 4)
    loss, met = policy_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.2)
    assert float(loss) == pytest.approx(0.15, abs=1e-6)
    assert met["clip_frac"] == pytest.approx(0.5)
    # clip-higher 0.28 (DAPO): t0 -> max(-1.5, -1.28) = -1.28 ; others unchanged
    # mean = (-1.28 - 0.5 + 0.8 + 1.5)/4 = 0.13
    loss, _ = policy_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.28)
    assert float(loss) == pytest.approx(0.13, abs=1e-6)


def test_policy_loss_dual_clip():
    # r = 5, A = -1: standard = max(5, 1.2) = 5 ; dual-clip c = 3 -> min(5, 3) = 3
    # r = 5, A = +1: standard = max(-5, -1.2) = -1.2 ; dual clip applies to A < 0 only -> -1.2
    lp = torch.tensor([[L(5.0), L(5.0)]])
    adv = torch.tensor([[-1.0, 1.0]])
    loss, met = policy_loss(lp, torch.zeros(1, 2), adv, torch.ones(1, 2), dual_clip=3.0)
    assert float(loss) == pytest.approx((3.0 - 1.2) / 2, abs=1e-6)
    assert met["dual_clip_frac"] == pytest.approx(0.5)


def test_policy_loss_sequence_advantage_broadcast_and_gradient():
    # on-policy (ratio 1): loss = -mean(A) ; d loss / d logp_t = -A_t / N
    lp = torch.zeros(2, 2, requires_grad=True)
    adv = torch.tensor([1.0, -2.0])  # [B] broadcast over tokens
    m = torch.tensor([[1, 1], [1, 0]])
    loss, _ = policy_loss(lp, torch.zeros(2, 2), adv, m)
    # tokens: -1, -1, +2 -> mean 0/3 = 0
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 3, -1 / 3], [2 / 3, 0.0]]))


def test_truncated_importance_sampling():
    # proximal (old) vs behaviour: w = min(exp(old - behav), cap)
    #   t0: exp(ln 3 - 0) = 3 -> capped at 2 ; t1: exp(ln 0.5) = 0.5
    # ratio 1 (logp = old), A = 1 -> per-token loss -1 * w = [-2, -0.5] -> mean -1.25
    old = torch.tensor([[L(3.0), L(0.5)]])
    behav = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    w, wm = correction_weights(old, behav, mask, mode="token_tis", high=2.0)
    loss, _ = policy_loss(old.clone(), old, torch.ones(1, 2), mask, is_weights=w)
    assert float(loss) == pytest.approx(-1.25, abs=1e-6)
    assert wm["correction_weight_mean"] == pytest.approx(1.25, abs=1e-6)


def test_kl_estimators():
    # logp = ln 0.5, ref = ln 0.25 -> d = ref - logp = ln 0.5 = -0.693147
    # k1 = -d = 0.693147 ; k2 = d^2/2 = 0.240227 ; k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    lp, ref = torch.tensor([L(0.5)]), torch.tensor([L(0.25)])
    assert float(kl_penalty(lp, ref, "k1")) == pytest.approx(0.693147, abs=1e-6)
    assert float(kl_penalty(lp, ref, "k2")) == pytest.approx(0.240227, abs=1e-6)
    assert float(kl_penalty(lp, ref, "k3")) == pytest.approx(0.193147, abs=1e-6)
    assert float(kl_penalty(lp, lp, "k3")) == 0.0
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "k9")


def test_value_loss_clipping():
    # old 0, returns 1, new value 0.5, clip 0.2: unclipped (0.5-1)^2 = 0.25 ; clipped V = 0.2 -> (0.2-1)^2 = 0.64
    #   -> 0.5 * max = 0.32 (clipped counted)
    # second token: new -0.1, old 0, R 0 -> within clip: 0.5 * 0.01 = 0.005 both
    # token mean = (0.32 + 0.005)/2 = 0.1625
    v = torch.tensor([[0.5, -0.1]])
    loss, met = value_loss(
        v, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), clip=0.2
    )
    assert float(loss) == pytest.approx(0.1625, abs=1e-6)
    assert met["vf_clip_frac"] == pytest.approx(0.5)
    loss, _ = value_loss(
        v, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), clip=None
    )
    assert float(loss) == pytest.approx((0.125 + 0.005) / 2, abs=1e-6)


def test_entropy_and_token_logprobs():
    # uniform over 4 -> H = ln 4 ; one-hot-ish (logits [0, -inf...]) -> H = 0
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]]])
    h = entropy_from_logits(logits)
    torch.testing.assert_close(h, torch.tensor([[math.log(4), 0.0]]), atol=1e-5, rtol=0)
    # logits [ln 1, ln 3] -> p = [0.25, 0.75]; label 1 -> ln 0.75 ; temperature 2 halves logits
    lg = torch.tensor([[[0.0, L(3.0)]]])
    assert float(token_logprobs(lg, torch.tensor([[1]]))) == pytest.approx(L(0.75), abs=1e-6)
    # T=2: logits [0, ln3/2] -> p1 = sqrt3/(1+sqrt3)
    s3 = math.sqrt(3)
    assert float(token_logprobs(lg, torch.tensor([[1]]), 2.0)) == pytest.approx(
        L(s3 / (1 + s3)), abs=1e-6
    )
