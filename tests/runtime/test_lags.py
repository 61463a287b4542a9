"""Policy-version lags: checked before every optimizer update, counted per step (by hand)."""

import copy

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.runtime import stages
from rpeg.runtime.algorithms import StaleSampleError, check_minibatch, lag_metrics
from rpeg.runtime.data import ArithmeticSource
from rpeg.runtime.rewards import RewardSet
from rpeg.runtime.roles import PolicyWorker


def test_check_minibatch_returns_the_update_lag():
    # rows lag 0, 1, 1 versions at update u = 2 of a step with U = 4 updates:
    # update lag = 1 * 4 + 2 = 6 optimizer updates since the oldest row's weights
    assert check_minibatch(torch.tensor([0, 1, 1]), 1, update=2, updates_per_step=4) == 6
    # no row of the mini-batch on this rank (and none on the others): -1
    assert check_minibatch(None, 1, update=0, updates_per_step=4) == -1
    # no bound: any lag passes
    assert check_minibatch(torch.tensor([5]), None, update=0, updates_per_step=1) == 5


def test_check_minibatch_refuses_a_lag_beyond_k_or_from_the_future():
    with pytest.raises(StaleSampleError, match="lags the trained policy by 2 versions"):
        check_minibatch(torch.tensor([0, 2]), 1, update=0, updates_per_step=4)
    with pytest.raises(StaleSampleError, match="after the policy being trained"):
        check_minibatch(torch.tensor([-1, 0]), 1, update=0, updates_per_step=4)


def test_check_minibatch_agrees_over_the_group():
    # this rank's rows are fine (lag 0); another rank holds a row at lag 2 (the max-reduce
    # returns the group's [max lag, -min lag] = [2, 0]): this rank raises too
    from rpeg.runtime.parallel import RankReduce

    group = RankReduce(
        world_size=2, sum=lambda t: t, max=lambda t: torch.maximum(t, torch.tensor([2, 0]))
    )
    with pytest.raises(StaleSampleError):
        check_minibatch(torch.tensor([0]), 1, update=0, updates_per_step=1, reduce=group)


def test_lag_histogram():
    # lags 0,1,1,0,1 with k = 2: counts [2, 3, 0]; mean 3/5 = 0.6; max 1
    m = lag_metrics(torch.tensor([0, 1, 1, 0, 1]), 2, update_lag_max=6)
    assert m == {
        "staleness_lag_0": 2.0,
        "staleness_lag_1": 3.0,
        "staleness_lag_2": 0.0,
        "staleness_lag_mean": 0.6,
        "staleness_lag_max": 1.0,
        "staleness_update_lag_max": 6.0,
    }
    # no bound: as many bins as the largest lag needs
    m = lag_metrics(torch.tensor([0, 3]), None, update_lag_max=-1)
    assert [m[f"staleness_lag_{i}"] for i in range(4)] == [1.0, 0.0, 0.0, 1.0]
    assert "staleness_lag_4" not in m and m["staleness_update_lag_max"] == 0.0


def _setup(tiny, **over):
    base = {
        "workload.num_prompts": 2,
        "workload.samples_per_prompt": 4,
        "workload.max_response_tokens": 4,
        "workload.micro_batch_size": 8,
        "workload.train_minibatches": 2,
        "algorithm.ppo_epochs": 2,
    }
    cfg = RunConfig().with_overrides({**base, **over})
    model, tok = tiny
    w = PolicyWorker(
        copy.deepcopy(model), tok, algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload
    )
    exs = [ArithmeticSource(1)[i] for i in range(2)]
    batch, _ = stages.generate_stage(w, exs, 4, seed=0)
    batch, _ = stages.reward_stage(batch, RewardSet(["exact_numeric"]))
    batch = batch.replace(rewards=torch.arange(8, dtype=torch.float32))  # non-zero advantages
    return cfg, w, batch


def test_train_step_counts_lags_per_update(tiny):
    # 8 rows generated at version 0, trained at version 1 (lag 1, k = 1); U = 2 epochs x 2
    # mini-batches = 4 updates: the last one (u = 3) is 1 * 4 + 3 = 7 updates past the
    # weights that sampled the rows
    cfg, w, batch = _setup(tiny)
    w.policy_version, w.max_staleness = 1, 1
    batch, _ = stages.old_logprob_stage(w, batch, recompute=True)
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, 4)
    m = w.train_step(batch)
    assert (m["staleness_lag_0"], m["staleness_lag_1"]) == (0.0, 8.0)
    assert m["staleness_lag_mean"] == 1.0 and m["staleness_lag_max"] == 1.0
    assert m["staleness_update_lag_max"] == 7.0
    assert w.policy_version == 2


def test_train_step_refuses_rows_older_than_k(tiny):
    # the same rows at lag 2 with k = 1: stopped before the first update, weights untouched
    cfg, w, batch = _setup(tiny)
    w.policy_version, w.max_staleness = 2, 1
    batch, _ = stages.old_logprob_stage(w, batch, recompute=True)
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, 4)
    before = copy.deepcopy(w.lm.state_dict())
    with pytest.raises(StaleSampleError, match="more than max_staleness k=1"):
        w.train_step(batch)
    assert all(torch.equal(before[k], v) for k, v in w.lm.state_dict().items())
    assert w.policy_version == 2


def test_mismatch_measured_and_corrections_applied_in_a_train_step(tiny):
    # on-policy, same weights: the recomputed old log-probs equal the engine's (|r| < 1e-4);
    # one update (one mini-batch, one epoch): the step's metric is the whole batch's share
    cfg, w, batch = _setup(
        tiny,
        **{
            "algorithm.rollout_correction.mode": "token_mis",
            "algorithm.rollout_correction.apply_to": "all",
            "workload.train_minibatches": 1,
            "algorithm.ppo_epochs": 1,
        },
    )
    b, m = stages.old_logprob_stage(w, batch, recompute=True)
    assert m["logprob_mismatch_mean"] < 1e-4 and m["logprob_mismatch_frac_over"] == 0.0
    _, m0 = stages.old_logprob_stage(w, batch, recompute=False)
    assert "logprob_mismatch_mean" not in m0  # behaviour log-probs reused: nothing measured
    # make the engine's log-probs of row 0 ln 3 lower: rho = 3 > 2 there -> its tokens dropped
    sample = b.sample_logprobs.clone()
    sample[0] -= torch.log(torch.tensor(3.0)) * b.response_mask[0]
    b = b.replace(sample_logprobs=sample)
    b, _ = stages.advantage_stage(b, cfg.algorithm, 4)
    out = w.train_step(b)
    tokens = b.response_mask.sum(-1).float()
    assert out["correction_masked_frac"] == pytest.approx(float(tokens[0] / tokens.sum()), abs=1e-6)


class _ShiftedEngine:
    """The torch engine whose reported log-probs are 0.1 higher on every real token: an engine
    whose numerics differ from the trainer's (as vLLM's may), seen only through the interface."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def policy_version(self):
        return self.inner.policy_version

    def update_weights(self, state_dict, policy_version):
        self.inner.update_weights(state_dict, policy_version)

    def generate(self, prompt_ids, params, *, seed=None, max_new_tokens=None):
        import dataclasses

        out = self.inner.generate(prompt_ids, params, seed=seed, max_new_tokens=max_new_tokens)
        return dataclasses.replace(out, logprobs=out.logprobs + 0.1 * out.mask)


def test_mismatch_follows_the_engine_not_the_trainer(tiny):
    # r = train - rollout = -0.1 on every token (up to float noise of ~1e-6):
    # mean |r| = 0.1 ; k3 = exp(-0.1) - 1 + 0.1 = 0.0048374 ; |exp(-0.1) - 1| = 0.095 < 0.2
    from rpeg.runtime.engines.torch_engine import TorchEngine

    model, tok = tiny
    lm = copy.deepcopy(model)
    eng = _ShiftedEngine(TorchEngine(lm, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id))
    w = PolicyWorker(lm, tok, engine=eng)
    batch, _ = stages.generate_stage(w, [ArithmeticSource(1)[i] for i in range(2)], 4, seed=0)
    _, m = stages.old_logprob_stage(w, batch, recompute=True)
    assert m["logprob_mismatch_mean"] == pytest.approx(0.1, abs=1e-4)
    assert m["logprob_mismatch_k3"] == pytest.approx(0.0048374, abs=1e-5)
    assert m["logprob_mismatch_frac_over"] == 0.0


def test_mismatch_measured_on_the_first_update_without_an_extra_forward(tiny):
    # old log-probs reused from the engine (no recompute): the step's first optimizer update
    # runs its forward at the old weights, so its rows give the trainer's log-probs: r = -0.1
    # on every token again (later updates, after the weights moved, are not counted):
    # mean 0.1, k3 = exp(-0.1) - 1 + 0.1 = 0.0048374
    from rpeg.runtime.engines.torch_engine import TorchEngine

    cfg, _, _ = _setup(tiny)  # 2 mini-batches x 2 epochs
    model, tok = tiny
    lm = copy.deepcopy(model)
    eng = _ShiftedEngine(TorchEngine(lm, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id))
    w = PolicyWorker(
        lm, tok, algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload, engine=eng
    )
    batch, _ = stages.generate_stage(w, [ArithmeticSource(1)[i] for i in range(2)], 4, seed=0)
    batch = batch.replace(rewards=torch.arange(8, dtype=torch.float32))
    batch, m0 = stages.old_logprob_stage(w, batch, recompute=False)
    assert "logprob_mismatch_mean" not in m0
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, 4)
    m = w.train_step(batch)
    assert m["logprob_mismatch_mean"] == pytest.approx(0.1, abs=1e-4)
    assert m["logprob_mismatch_k3"] == pytest.approx(0.0048374, abs=1e-5)
