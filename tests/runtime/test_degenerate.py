"""Degenerate training is warned about and, past runtime.degenerate_steps_limit consecutive
steps, stopped with a named error (issue 28: GRPO at temperature 0 trained on all-zero
advantages and a reward of 1e308 skipped every update, both silently with exit 0)."""

from __future__ import annotations

import math

import pytest

from rpeg.runtime.degenerate import DegenerateTraining, DegenerateWatch, why_degenerate

OK = {"reward_mean": 0.5, "reward_std": 0.5, "advantage_abs_mean": 0.7}


def test_each_kind_is_named():
    assert why_degenerate(OK) is None
    assert "every advantage is 0" in why_degenerate({**OK, "advantage_abs_mean": 0.0})
    assert "reward_mean is inf" in why_degenerate({**OK, "reward_mean": math.inf})
    assert "reward_std is 1e+308" in why_degenerate({**OK, "reward_std": 1e308})
    assert "skipped" in why_degenerate({**OK, "skipped_update_frac": 1.0})
    assert why_degenerate({**OK, "skipped_update_frac": 0.5}) is None  # some updates ran


def test_warned_then_stopped_after_the_limit_and_a_good_step_resets():
    w = DegenerateWatch(3, greedy=True)
    bad = {**OK, "advantage_abs_mean": 0.0}
    for s in (0, 1):
        with pytest.warns(RuntimeWarning, match=f"step {s}: nothing to learn"):
            w.check(s, bad)
    w.check(2, OK)  # resets the count
    for s in (3, 4):
        with pytest.warns(RuntimeWarning):
            w.check(s, bad)
    with pytest.raises(DegenerateTraining, match="degenerate_steps_limit = 3"):
        w.check(5, bad)


def test_zero_only_warns():
    w = DegenerateWatch(0)
    for s in range(50):
        with pytest.warns(RuntimeWarning):
            w.check(s, {**OK, "reward_mean": math.nan})


def test_grpo_at_temperature_zero_is_stopped_in_the_local_trainer(tmp_path):
    """All samples of a group are alike at temperature 0: every advantage is 0."""
    from rpeg.config import RunConfig
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = RunConfig.from_dict(
        {
            "workload": {
                "num_prompts": 2,
                "samples_per_prompt": 2,
                "max_response_tokens": 6,
                "micro_batch_size": 4,
                "temperature": 0.0,
            },
            "task": {"heldout_size": 2},
            "runtime": {
                "steps": 4,
                "degenerate_steps_limit": 2,
                "output_dir": str(tmp_path / "out"),
            },
        }
    )
    with (
        pytest.warns(RuntimeWarning, match="every advantage is 0"),
        pytest.raises(DegenerateTraining, match="step 1"),
    ):
        LocalTrainer(cfg, log=lambda *_: None).run(out_dir=tmp_path / "out")


def test_zero_advantages_at_a_positive_temperature_warn_and_training_goes_on():
    """Sampling still varies: a model that earns no reward yet may find one later (verl and
    TRL go on). Rewards that break the arithmetic still stop it."""
    w = DegenerateWatch(3)
    for s in range(10):
        with pytest.warns(RuntimeWarning, match="training goes on"):
            w.check(s, {**OK, "advantage_abs_mean": 0.0})
    for s in (10, 11):
        with pytest.warns(RuntimeWarning):
            w.check(s, {**OK, "reward_mean": math.nan})
    with pytest.raises(DegenerateTraining, match="reward_mean is nan"):
        w.check(12, {**OK, "reward_mean": math.nan})
    greedy = DegenerateWatch(2, greedy=True)
    with pytest.warns(RuntimeWarning):
        greedy.check(0, {**OK, "advantage_abs_mean": 0.0})
    with pytest.raises(DegenerateTraining, match="every advantage is 0"):
        greedy.check(1, {**OK, "advantage_abs_mean": 0.0})
