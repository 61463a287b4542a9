"""Joining rollout batches keeps prompt groups apart: every generation call (a streamed
chunk, a generator rank's slice) numbers its prompts from 0, and DAPO's dynamic-sampling
filter groups rows by ``group_ids``."""

import torch

from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.stages import filter_groups


def _batch(rewards: list[float], samples: int = 2) -> RolloutBatch:
    b = len(rewards)
    return RolloutBatch(
        prompt_ids=torch.ones((b, 3), dtype=torch.long),
        prompt_mask=torch.ones((b, 3), dtype=torch.long),
        response_ids=torch.ones((b, 2), dtype=torch.long),
        response_mask=torch.ones((b, 2), dtype=torch.long),
        sample_logprobs=torch.zeros((b, 2)),
        policy_version=torch.zeros(b, dtype=torch.long),
        group_ids=torch.arange(b // samples).repeat_interleave(samples),
        rewards=torch.tensor(rewards),
    )


def test_concat_gives_each_part_its_own_group_ids():
    a, b = _batch([1.0, 0.0, 1.0, 1.0]), _batch([0.0, 0.0, 1.0, 0.0])
    j = RolloutBatch.concat([a, b])
    assert j.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # a part that was filtered before (ids 1 only) still does not collide with the next
    j2 = RolloutBatch.concat([a.select([2, 3]), b])
    assert j2.group_ids.tolist() == [1, 1, 2, 2, 3, 3]


def test_dynamic_sampling_on_a_joined_batch_keeps_the_mixed_groups():
    # part 1: group 0 mixed (kept), group 1 all 1s (dropped);
    # part 2: group 0 all 0s (dropped), group 1 mixed (kept).
    # With colliding ids, "group 0" would pool [1, 0, 0, 0] and "group 1" [1, 1, 1, 0]:
    # both mixed, all 8 rows kept.
    j = RolloutBatch.concat([_batch([1.0, 0.0, 1.0, 1.0]), _batch([0.0, 0.0, 1.0, 0.0])])
    kept, m = filter_groups(j)
    assert kept.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert m["groups_kept_frac"] == 0.5
