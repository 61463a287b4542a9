"""Rollout/trainer mismatch metrics and each correction mode, against values worked out by hand.

Convention of every test: the rollout log-probs are 0, so the trainer's log-prob of a token
*is* its log-ratio ``r = ln rho`` and ``rho`` can be read off directly.
"""

import math

import pytest
import torch

from rpeg.config import ROLLOUT_CORRECTION_BOUNDS, RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.algorithms import correction_weights, mismatch_metrics, policy_loss
from rpeg.runtime.parallel import RankReduce

L = math.log

# two sequences: rho = [3, 0.5, 1] and [0.4, 1.5, (padding: 9)]
RHO = torch.tensor([[3.0, 0.5, 1.0], [0.4, 1.5, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
TRAIN = RHO.log()
ROLLOUT = torch.zeros(2, 3)


def test_mismatch_metrics_by_hand():
    # r = [ln 2, ln 0.5, 0, ln 1.1] on four tokens; the fifth (r = 5) is padding
    train = torch.tensor([[L(2.0), L(0.5), 0.0], [L(1.1), 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    m = mismatch_metrics(train, torch.zeros(2, 3), mask, threshold=0.2)
    # mean |r| = (0.693147 + 0.693147 + 0 + 0.0953102) / 4 = 0.370401
    assert m["logprob_mismatch_mean"] == pytest.approx(0.370401, abs=1e-6)
    # k3 = exp(r) - 1 - r: 2-1-0.693147 = 0.306853 ; 0.5-1+0.693147 = 0.193147 ; 0 ;
    #      1.1-1-0.0953102 = 0.0046898 -> sum 0.504690 / 4 = 0.1261725
    assert m["logprob_mismatch_k3"] == pytest.approx(0.1261725, abs=1e-6)
    # |rho - 1| = 1, 0.5, 0, 0.1 -> two of four above 0.2
    assert m["logprob_mismatch_frac_over"] == pytest.approx(0.5)
    assert m["logprob_mismatch_max"] == pytest.approx(0.693147, abs=1e-6)


def test_mismatch_metrics_direction_and_empty():
    # k3 is KL(rollout || train) on tokens the rollout sampled: swapping the two changes it
    # rho = 2: exp(ln 2) - 1 - ln 2 = 0.306853 ; rho = 1/2: 0.5 - 1 + ln 2 = 0.193147
    one = torch.ones(1, 1)
    a = mismatch_metrics(torch.tensor([[L(2.0)]]), torch.zeros(1, 1), one)
    b = mismatch_metrics(torch.zeros(1, 1), torch.tensor([[L(2.0)]]), one)
    assert a["logprob_mismatch_k3"] == pytest.approx(0.306853, abs=1e-6)
    assert b["logprob_mismatch_k3"] == pytest.approx(0.193147, abs=1e-6)
    assert a["logprob_mismatch_mean"] == b["logprob_mismatch_mean"]
    none = mismatch_metrics(torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    assert set(none.values()) == {0.0}


def test_mismatch_metrics_span_the_data_parallel_group():
    # a "group" of two identical ranks: sums double, means and the max stay those of one
    twice = RankReduce(world_size=2, sum=lambda t: 2 * t, max=lambda t: t)
    train = torch.tensor([[L(2.0), L(0.5), 0.0], [L(1.1), 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert mismatch_metrics(train, torch.zeros(2, 3), mask, reduce=twice) == pytest.approx(
        mismatch_metrics(train, torch.zeros(2, 3), mask)
    )


def _w(mode, **bounds):
    w, m = correction_weights(TRAIN, ROLLOUT, MASK, mode=mode, **bounds)
    return w, m


def test_none_is_weight_one_on_real_tokens():
    w, m = _w("none")
    torch.testing.assert_close(w, MASK.float())
    assert m == {"correction_weight_mean": 1.0, "correction_masked_frac": 0.0}


def test_token_tis():
    # min(rho, 2): [2, 0.5, 1], [0.4, 1.5, pad 0] -> mean 5.4 / 5 = 1.08
    w, m = _w("token_tis", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [0.4, 1.5, 0.0]]))
    assert m["correction_weight_mean"] == pytest.approx(1.08)
    assert m["correction_masked_frac"] == 0.0


def test_seq_tis():
    # products over real tokens: 3 * 0.5 * 1 = 1.5 ; 0.4 * 1.5 = 0.6 (padding's 9 not in it)
    w, m = _w("seq_tis", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [0.6, 0.6, 0.0]]))
    assert m["correction_weight_mean"] == pytest.approx((4.5 + 1.2) / 5)
    # cap 1.2: the first sequence's 1.5 -> 1.2 ; mean (3.6 + 1.2) / 5 = 0.96
    w, m = _w("seq_tis", high=1.2)
    torch.testing.assert_close(w, torch.tensor([[1.2, 1.2, 1.2], [0.6, 0.6, 0.0]]))
    assert m["correction_weight_mean"] == pytest.approx(0.96)


def test_token_mis_drops_tokens_outside_the_bounds():
    # [0.5, 2] (bounds inclusive): 3 and 0.4 dropped, 0.5, 1, 1.5 keep rho
    w, m = _w("token_mis", low=0.5, high=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 1.0], [0.0, 1.5, 0.0]]))
    assert m["correction_weight_mean"] == pytest.approx(3.0 / 5)
    assert m["correction_masked_frac"] == pytest.approx(2 / 5)


def test_seq_mis_drops_whole_sequences():
    # [0.5, 2]: both products (1.5, 0.6) inside -> kept with their product
    w, m = _w("seq_mis", low=0.5, high=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [0.6, 0.6, 0.0]]))
    assert m["correction_masked_frac"] == 0.0
    # [0.5, 1.2]: 1.5 > 1.2 -> the whole first sequence dropped (3 of 5 tokens)
    w, m = _w("seq_mis", low=0.5, high=1.2)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [0.6, 0.6, 0.0]]))
    assert m["correction_masked_frac"] == pytest.approx(3 / 5)
    assert m["correction_weight_mean"] == pytest.approx(1.2 / 5)


def test_icepop_two_sided_token_mask():
    # IcePop's [0.5, 5]: 3 is now kept, 0.4 (below 0.5) still dropped
    low, high = ROLLOUT_CORRECTION_BOUNDS["icepop"]
    w, m = _w("icepop", low=low, high=high)
    torch.testing.assert_close(w, torch.tensor([[3.0, 0.5, 1.0], [0.0, 1.5, 0.0]]))
    assert m["correction_masked_frac"] == pytest.approx(1 / 5)
    # a token far below the bound (rho = 0.01) is dropped too: two-sided
    w, _ = correction_weights(
        torch.tensor([[L(0.01), L(6.0)]]),
        torch.zeros(1, 2),
        torch.ones(1, 2),
        mode="icepop",
        low=low,
        high=high,
    )
    assert w.tolist() == [[0.0, 0.0]]


def test_sequence_products_are_bounded_in_log_space():
    # 100 tokens of rho = e: the product e^100 would overflow fp32; bounded at e^20
    w, _ = correction_weights(
        torch.ones(1, 100), torch.zeros(1, 100), torch.ones(1, 100), mode="seq_tis", high=None
    )
    assert torch.isfinite(w).all() and float(w[0, 0]) == pytest.approx(math.exp(20.0), rel=1e-5)


def test_dropped_tokens_add_nothing_but_stay_in_the_denominator():
    # logp = old (PPO ratio 1), A = 1: token loss -w ; token_mean over the 5 real tokens
    # token_mis [0.5, 2]: w = [0, 0.5, 1], [0, 1.5] -> loss -(3.0) / 5 = -0.6 ;
    # d loss / d logp_t = -w_t / 5 -> [0, -0.1, -0.2], [0, -0.3, 0]
    old = torch.zeros(2, 3)
    lp = torch.zeros(2, 3, requires_grad=True)
    w, _ = correction_weights(TRAIN, ROLLOUT, MASK, mode="token_mis", low=0.5, high=2.0)
    loss, _ = policy_loss(lp, old, torch.ones(2, 3), MASK, is_weights=w)
    assert float(loss.detach()) == pytest.approx(-0.6)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -0.1, -0.2], [0.0, -0.3, 0.0]]))


def test_config_defaults_and_bad_input():
    rc = RunConfig().algorithm.rollout_correction
    assert (rc.mode, rc.apply_to, rc.measure) == ("token_tis", "stale", "first_update")
    assert rc.bounds() == (None, 2.0)
    icepop = RunConfig.from_dict({"algorithm": {"rollout_correction": {"mode": "icepop"}}})
    assert icepop.algorithm.rollout_correction.bounds() == (0.5, 5.0)
    mis = RunConfig.from_dict(
        {"algorithm": {"rollout_correction": {"mode": "token_mis", "high": 3.0}}}
    )
    assert mis.algorithm.rollout_correction.bounds() == (0.5, 3.0)
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"algorithm": {"rollout_correction": {"mode": "tis", "high": 0.5}}})
    where = {p.where for p in e.value.problems}
    assert where == {"algorithm.rollout_correction.mode", "algorithm.rollout_correction.high"}
    with pytest.raises(ConfigError, match="mode 'token_tis' does not use it"):
        RunConfig.from_dict({"algorithm": {"rollout_correction": {"low": 0.2}}})
    with pytest.raises(ConfigError, match="replaced by rollout_correction"):
        RunConfig.from_dict({"algorithm": {"off_policy_correction": "tis", "tis_cap": 3.0}})


def test_run_summary_carries_the_mismatch_over_the_steps_that_measured_it():
    from rpeg.runtime.summary import run_summary

    # steps 0 and 2 measured (0.1, 0.3 -> mean 0.2); max of the maxima; lags: max 1
    hist = [
        {"reward_mean": 0.0, "logprob_mismatch_mean": 0.1, "logprob_mismatch_max": 0.5},
        {"reward_mean": 0.0, "staleness_lag_max": 1.0},
        {"reward_mean": 0.0, "logprob_mismatch_mean": 0.3, "logprob_mismatch_max": 0.2},
    ]
    s = run_summary(hist, wall_s=1.0, acc_before=None, acc_after=None)
    assert s["logprob_mismatch_mean"] == pytest.approx(0.2)
    assert s["logprob_mismatch_max"] == 0.5 and s["staleness_lag_max"] == 1.0
    assert "logprob_mismatch_k3" not in s  # never measured: not reported
