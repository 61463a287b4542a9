"""Batches, workers, stage functions and the local trainer."""

import copy
import json

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime import stages
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.critic import CriticWorker
from rpeg.runtime.data import ArithmeticSource
from rpeg.runtime.rewards import RewardSet
from rpeg.runtime.roles import PolicyWorker

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def _cfg(**over):
    base = {
        "workload.num_prompts": 4,
        "workload.samples_per_prompt": 4,
        "workload.max_response_tokens": 6,
        "workload.micro_batch_size": 8,
        "workload.train_minibatches": 2,
        "task.heldout_size": 8,
        "runtime.steps": 2,
    }
    base.update(over)
    return RunConfig().with_overrides(base)


def _worker(tiny, cfg, **kw):
    model, tok = tiny
    return PolicyWorker(
        copy.deepcopy(model),
        tok,
        algorithm=cfg.algorithm,
        optim=cfg.optim,
        workload=cfg.workload,
        **kw,
    )


def _rollout(worker, cfg, seed=0):
    exs = [ArithmeticSource(1)[i] for i in range(cfg.workload.num_prompts)]
    batch, m = stages.generate_stage(worker, exs, cfg.workload.samples_per_prompt, seed=seed)
    batch, _ = stages.reward_stage(batch, RewardSet(["exact_numeric"]))
    return batch, m


def test_generate_stage_fields(tiny):
    cfg = _cfg()
    w = _worker(tiny, cfg)
    batch, m = _rollout(w, cfg)
    assert batch.size == 16 and batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert batch.prompt_ids.shape == batch.prompt_mask.shape
    assert batch.response_ids.shape == batch.sample_logprobs.shape == batch.response_mask.shape
    assert (batch.policy_version == 0).all() and batch.rewards.shape == (16,)
    assert m["response_length"] > 0
    # the old-logprob stage reproduces the sampling log-probs (on-policy)
    b2, _ = stages.logprob_stage(w, batch, "old_logprobs")
    torch.testing.assert_close(b2.old_logprobs, batch.sample_logprobs, atol=1e-4, rtol=0)


def test_batch_select_split_concat(tiny):
    cfg = _cfg()
    batch, _ = _rollout(_worker(tiny, cfg), cfg)
    parts = batch.split(3)
    assert sum(p.size for p in parts) == batch.size
    joined = RolloutBatch.concat(parts)
    r = joined.response_ids.shape[1]
    assert torch.equal(joined.response_ids, batch.response_ids[:, :r])
    assert torch.equal(joined.rewards, batch.rewards)
    assert RolloutBatch.from_dict(batch.to_dict()).size == batch.size


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce_pp"])
def test_grpo_family_step(tiny, algo):
    cfg = _cfg(**{"algorithm.name": algo, "algorithm.kl_coef": 0.1})
    w = _worker(tiny, cfg)
    ref = _worker(tiny, cfg, trainable=False)
    batch, _ = _rollout(w, cfg)
    batch, _ = stages.behaviour_as_old(batch)
    batch, _ = stages.logprob_stage(ref, batch, "ref_logprobs")
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, cfg.workload.samples_per_prompt)
    before = copy.deepcopy(w.lm.state_dict())
    _, m = stages.train_actor_stage(w, batch)
    assert w.policy_version == 1
    for k in ("grad_norm", "entropy", "kl", "clip_frac", "pg_loss", "train_tokens_per_s"):
        assert k in m
    changed = any(not torch.equal(before[k], v) for k, v in w.lm.state_dict().items())
    assert changed == bool(batch.advantages.abs().sum() > 0)


@pytest.mark.parametrize("shared", [False, True])
def test_ppo_step(tiny, shared):
    cfg = _cfg(**{"algorithm.name": "ppo", "algorithm.share_actor_critic": shared})
    w = _worker(tiny, cfg, value_head=shared)
    critic = (
        w
        if shared
        else CriticWorker(
            copy.deepcopy(tiny[0]), algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload
        )
    )
    batch, _ = _rollout(w, cfg)
    batch, _ = stages.behaviour_as_old(batch)
    batch, _ = stages.value_stage(critic, batch)
    assert batch.values.shape == batch.response_ids.shape
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, cfg.workload.samples_per_prompt)
    assert batch.returns is not None
    _, m = stages.train_actor_stage(w, batch)
    if shared:
        assert "value_loss" in m
    else:
        _, cm = stages.train_critic_stage(critic, batch)
        assert "value_loss" in cm


def test_stale_samples_use_truncated_importance_sampling(tiny):
    cfg = _cfg()
    w = _worker(tiny, cfg)
    batch, _ = _rollout(w, cfg)
    w.policy_version = 2  # the batch is two versions old
    batch, _ = stages.logprob_stage(w, batch, "old_logprobs")
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, cfg.workload.samples_per_prompt)
    _, m = stages.train_actor_stage(w, batch)
    assert m["correction_weight_mean"] == pytest.approx(1.0, abs=1e-3)  # same weights -> w = 1


def test_worker_state_dict_round_trip(tiny):
    cfg = _cfg()
    w = _worker(tiny, cfg)
    batch, _ = _rollout(w, cfg)
    batch, _ = stages.behaviour_as_old(batch)
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, cfg.workload.samples_per_prompt)
    w.train_step(batch)
    state = w.state_dict()
    w2 = _worker(tiny, cfg)
    w2.train_step(batch)  # create optimizer state, then overwrite it
    w2.load_state_dict(state)
    m1, m2 = w.train_step(batch), w2.train_step(batch)
    assert m1["pg_loss"] == pytest.approx(m2["pg_loss"], abs=1e-6)
    for k, v in w.lm.state_dict().items():
        torch.testing.assert_close(v, w2.lm.state_dict()[k])


def test_prompt_too_long_is_a_clear_error(tiny):
    cfg = _cfg(**{"workload.max_prompt_tokens": 4})
    w = _worker(tiny, cfg)
    with pytest.raises(ConfigError, match="max_prompt_tokens=4"):
        w.encode_prompts(["123456789+1="])
    cfg = _cfg(**{"workload.max_response_tokens": 250, "workload.max_prompt_tokens": 64})
    with pytest.raises(ConfigError, match="context"):
        _worker(tiny, cfg).encode_prompts(["1+1=" * 3])


def test_local_trainer_two_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE", str(tmp_path / "cache"))
    from rpeg.runtime import local_trainer as local

    cfg = _cfg(
        **{
            "model.tiny_shape": SMALL,
            "optim.warmup_sft_steps": 3,
            "runtime.max_staleness": 1,
            "runtime.output_dir": str(tmp_path / "out"),
        }
    )
    tr = local.LocalTrainer(cfg)
    s = tr.run()
    assert s["steps"] == 2 and 0 <= s["heldout_acc_after"] <= 1
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "reward_mean" in json.loads(lines[0])
    assert [json.loads(x)["step"] for x in lines] == [1, 2]  # integers, as the console counts
    assert (tmp_path / "out" / "reward_curve.png").exists()
    assert json.loads(lines[1])["staleness_max"] == 1.0  # generator lags one version (k = 1)
    # the warm-up is cached: a second trainer loads it
    tr2 = local.LocalTrainer(cfg)
    assert tr2.warmup_info["warmup_cached"] == 1.0


@pytest.mark.slow
def test_builtin_task_learns(tmp_path, monkeypatch):
    """The built-in task with its defaults (fresh warm-up, then GRPO) learns within 30 steps:
    about 75 s on 2 cores. Measured with seed 0 on 2026-12-02: held-out greedy accuracy
    0.34 -> 0.48, sampled reward 0.36 -> 0.39 (an earlier library set gave 0.34 -> 0.53 and
    0.38 -> 0.49: the sampled reward's 10-step means move with float numerics, so the held-out
    accuracy carries the margin and the reward only has to rise)."""
    monkeypatch.setenv("RPEG_CACHE", str(tmp_path / "cache"))
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = RunConfig().with_overrides(
        {"runtime.steps": 30, "runtime.output_dir": str(tmp_path / "out")}
    )
    s = LocalTrainer(cfg).run()
    assert s["heldout_acc_after"] > s["heldout_acc_before"] + 0.1
    assert s["reward_last10"] > s["reward_first10"]


def test_shared_forward_fills_old_logprobs_and_values_and_matches_separate_passes(tiny):
    cfg = _cfg(**{"algorithm.name": "ppo", "algorithm.share_actor_critic": True})
    w = _worker(tiny, cfg, value_head=True)
    batch, _ = _rollout(w, cfg)
    from rpeg.compile import compile_local

    # the compiled unit says the forward is shared (TaskSpec.shared_forward): the stage reads it
    unit = next(t for t in compile_local(cfg).tasks if "old_logprob" in t.kinds)
    assert unit.shared_forward
    ctx = stages.StageContext(cfg, actor=w, rewards=RewardSet(["exact_numeric"]), unit=unit)
    out, m = stages.run_stage("old_logprob", ctx, batch)
    assert m["shared_forward"] == 1.0 and m["staleness_max"] == 0.0
    torch.testing.assert_close(out.old_logprobs, w.compute_logprobs(batch))
    torch.testing.assert_close(out.values, w.compute_values(batch))
    again, vm = stages.run_stage("values", ctx, out)  # already filled: no second forward
    assert vm == {} and again.values is out.values


def test_on_policy_old_logprobs_reuse_sampling_logprobs_unless_recompute(tiny):
    cfg = _cfg()
    w = _worker(tiny, cfg)
    batch, _ = _rollout(w, cfg)
    reused, _ = stages.old_logprob_stage(w, batch)
    assert torch.equal(reused.old_logprobs, batch.sample_logprobs)
    recomputed, m = stages.old_logprob_stage(w, batch, recompute=True)
    assert "old_logprob_s" in m
    torch.testing.assert_close(recomputed.old_logprobs, batch.sample_logprobs, atol=1e-4, rtol=1e-4)


def test_run_stage_names_the_allowed_kinds(tiny):
    ctx = stages.StageContext(_cfg())
    with pytest.raises(ValueError, match="allowed: generate, reward"):
        stages.run_stage("sync_weights", ctx, object())
    with pytest.raises(ValueError, match="needs a batch"):
        stages.run_stage("reward", ctx, None)


def test_an_update_with_a_non_finite_gradient_is_skipped_not_applied(tiny):
    """A nan advantage in one row makes its mini-batch's gradient nan: that optimizer update
    is skipped (verl's actors do the same), the other one applies, every weight stays finite;
    with every row nan nothing changes at all."""
    from rpeg.runtime.updates import SKIPPED_UPDATES

    cfg = _cfg()  # 16 rows in 2 mini-batches
    w = _worker(tiny, cfg)
    batch, _ = _rollout(w, cfg)
    batch, _ = stages.behaviour_as_old(batch)
    batch, _ = stages.advantage_stage(batch, cfg.algorithm, cfg.workload.samples_per_prompt)
    batch = batch.replace(advantages=torch.ones_like(batch.advantages) * batch.response_mask)
    one_bad = batch.advantages.clone()
    one_bad[3] = float("nan")
    before = copy.deepcopy(w.lm.state_dict())
    _, m = stages.train_actor_stage(w, batch.replace(advantages=one_bad))
    assert m[SKIPPED_UPDATES] == 0.5, m
    after = w.lm.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], v) for k, v in after.items())

    w2 = _worker(tiny, cfg)
    before = copy.deepcopy(w2.lm.state_dict())
    all_bad = torch.full_like(batch.advantages, float("nan"))
    _, m = stages.train_actor_stage(w2, batch.replace(advantages=all_bad))
    assert m[SKIPPED_UPDATES] == 1.0 and m["grad_norm"] != m["grad_norm"]  # nan, reported
    assert all(torch.equal(before[k], v) for k, v in w2.lm.state_dict().items())
    assert not w2.optimizer.state  # no moment was fed a nan
    _, m = stages.train_actor_stage(w2, batch)  # and the next clean step trains as usual
    assert m[SKIPPED_UPDATES] == 0.0
    assert all(torch.isfinite(v).all() for v in w2.lm.state_dict().values())
