"""Issue 41 item 4: rewards routed by a row's ``data_source`` (verl's default_compute_score),
with shipped defaults for the common verl sources and each source's reward logged."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.rewards import RewardSet

# exact_numeric cannot read a LaTeX fraction; math_equivalence can
FRACTION = ("0.5", "\\frac{1}{2}")


def _task(**task):
    return RunConfig.model_validate({"task": task}).task


def test_a_math_source_is_scored_by_math_equivalence_a_gsm8k_one_by_exact_numeric():
    rs = RewardSet.from_task(_task(rewards=["exact_numeric"]))
    resp, ref = FRACTION
    res = rs(
        ["p"] * 3,
        [resp, resp, "42"],
        [ref, ref, "#### 42"],
        ["HuggingFaceH4/MATH-500", "openai/gsm8k", "numina_olympiads"],
    )
    # MATH-500 -> math_equivalence (right); gsm8k -> exact_numeric (cannot read \frac: 0);
    # numina_* (a pattern) -> math_equivalence on a plain number
    assert res.rewards == [1.0, 0.0, 1.0]
    assert res.correct == [1.0, 0.0, 1.0]
    assert res.applied["exact_numeric"] == [False, True, False]


def test_without_a_source_the_task_rewards_score_as_before():
    rs = RewardSet.from_task(_task(rewards=["exact_numeric"]))
    resp, ref = FRACTION
    assert rs(["p"], [resp], [ref]).rewards == [0.0]
    assert rs(["p"], [resp], [ref], ["some/unmapped"]).rewards == [0.0]


def test_other_rules_still_score_a_routed_row():
    rs = RewardSet.from_task(_task(rewards=["format", "exact_numeric"]))
    res = rs(["p"], ["<answer>0.5</answer>"], ["\\frac{1}{2}"], ["lighteval/MATH"])
    assert res.per_reward["format"] == [1.0]
    assert res.per_reward["math_equivalence"] == [1.0]
    assert res.rewards == [2.0]


def test_the_mapping_is_a_config_field_and_empty_turns_routing_off():
    rs = RewardSet.from_task(_task(rewards=["exact_numeric"], reward_by_source={}))
    assert rs(["p"], ["0.5"], ["\\frac{1}{2}"], ["HuggingFaceH4/MATH-500"]).rewards == [0.0]
    mine = RewardSet.from_task(
        _task(rewards=["exact_numeric"], reward_by_source={"my/fractions": "math_equivalence"})
    )
    assert mine(["p"], ["0.5"], ["\\frac{1}{2}"], ["my/fractions"]).rewards == [1.0]


def test_a_task_scored_by_its_own_rule_is_not_rerouted_by_the_shipped_defaults():
    rs = RewardSet.from_task(_task(rewards=["format"]))
    res = rs(["p"], ["<answer>1</answer>"], ["\\frac{1}{2}"], ["HuggingFaceH4/MATH-500"])
    assert res.rewards == [1.0] and set(res.per_reward) == {"format"}


def test_an_unknown_reward_in_the_mapping_is_refused_naming_the_source():
    with pytest.raises(ConfigError) as err:
        RewardSet.from_task(_task(reward_by_source={"my/src": "no_such_rule"}))
    assert "task.reward_by_source['my/src']" in str(err.value)
    from rpeg.preflight.inputs import check_task

    cfg = RunConfig.model_validate({"task": {"reward_by_source": {"my/src": ["nope"]}}})
    assert any("reward_by_source" in str(p) for p in check_task(cfg))


def test_each_source_reward_is_a_metric_of_the_reward_stage():
    import torch

    from rpeg.runtime.batch import RolloutBatch
    from rpeg.runtime.stages import reward_stage

    n = 4
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        response_ids=torch.ones(n, 3, dtype=torch.long),
        response_mask=torch.ones(n, 3, dtype=torch.long),
        sample_logprobs=torch.zeros(n, 3),
        policy_version=torch.zeros(n, dtype=torch.long),
        group_ids=torch.tensor([0, 0, 1, 1]),
        prompts=["p"] * n,
        responses=["0.5", "1", "7", "8"],
        reference_answers=["\\frac{1}{2}", "\\frac{1}{2}", "7", "7"],
        data_sources=["lighteval/MATH", "lighteval/MATH", "openai/gsm8k", "openai/gsm8k"],
    )
    rs = RewardSet.from_task(_task(rewards=["exact_numeric"]))
    rs.use_sources(batch.data_sources)
    out, m = reward_stage(batch, rs)
    assert m["reward/lighteval/MATH"] == 0.5 and m["reward/openai/gsm8k"] == 0.5
    assert m["accuracy/lighteval/MATH"] == 0.5
    # each rule's mean over the rows it scored, not over the whole batch
    assert m["reward/math_equivalence"] == 0.5 and m["reward/exact_numeric"] == 0.5
    assert out.reward_parts.shape == (n, 2)
    assert out.select([2, 0]).data_sources == ["openai/gsm8k", "lighteval/MATH"]


def test_a_verl_parquet_row_keeps_its_data_source(tmp_path):
    from rpeg.runtime.data import load_examples
    from rpeg.runtime.datasets.files import RowKeys
    from tests.firstday.tiny_hf import write_verl_parquet

    path = write_verl_parquet(tmp_path / "d.parquet", n=3)
    got = load_examples(str(path), "parquet", RowKeys("prompt", "reward_model.ground_truth"))
    assert [e.data_source for e in got] == ["openai/gsm8k"] * 3
