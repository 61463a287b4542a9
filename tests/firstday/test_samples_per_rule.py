"""samples.jsonl gives each reward rule's value, not only their sum (issue 29 item 4)."""

from __future__ import annotations

import torch

from rpeg.runtime import samples as S
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.rewards import RewardSet
from rpeg.runtime.stages import reward_stage


def _batch() -> RolloutBatch:
    b = 3
    return RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long),
        prompt_mask=torch.ones(b, 2, dtype=torch.long),
        response_ids=torch.ones(b, 2, dtype=torch.long),
        response_mask=torch.tensor([[1, 1], [1, 0], [1, 1]]),
        sample_logprobs=torch.zeros(b, 2),
        policy_version=torch.zeros(b, dtype=torch.long),
        group_ids=torch.zeros(b, dtype=torch.long),
        prompts=["p0", "p1", "p2"],
        responses=["4", "5", "four"],
        reference_answers=["4", "4", "4"],
    )


def _rules() -> RewardSet:
    def right(prompt: str, response: str, answer: str) -> float:
        return 1.0 if response == answer else 0.0

    def short(prompt: str, response: str, answer: str) -> float:
        return -0.25 * len(response)

    return RewardSet([("right", right), ("short", short)])


def test_each_rule_reaches_the_sample_and_the_sum_is_the_reward(tmp_path):
    rules = _rules()
    batch, m = reward_stage(_batch(), rules)
    assert batch.reward_parts.shape == (3, 2)
    got = S.samples_from_batch(batch, 0, rules=rules.names)
    # hand-worked: "4" right, 1 char; "5" wrong, 1 char; "four" wrong, 4 chars
    assert [s.reward_per_rule for s in got] == [
        {"right": 1.0, "short": -0.25},
        {"right": 0.0, "short": -0.25},
        {"right": 0.0, "short": -1.0},
    ]
    assert [s.reward for s in got] == [0.75, -0.25, -1.0]
    S.append_samples(tmp_path, got)
    assert S.read_samples(tmp_path / S.SAMPLES_FILE) == list(got)
    row = S.table_rows(got)[2]
    assert row["reward/right"] == 0.0 and row["reward/short"] == -1.0
    assert "reward_per_rule" not in row


def test_reward_parts_follow_the_rows_through_select_concat_and_the_wire():
    from rpeg.runtime.actors.serializers import batch_from_frames, batch_to_frames

    batch, _ = reward_stage(_batch(), _rules())
    picked = batch.select([2, 0])
    assert picked.reward_parts.tolist() == [[0.0, -1.0], [1.0, -0.25]]
    joined = RolloutBatch.concat([picked, batch.select([1])])
    assert joined.reward_parts.tolist() == [[0.0, -1.0], [1.0, -0.25], [0.0, -0.25]]
    back = batch_from_frames(*batch_to_frames(joined))
    assert torch.equal(back.reward_parts, joined.reward_parts)
