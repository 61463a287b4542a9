"""A multi-turn rollout in the staleness buffer survives a checkpoint (issue 31 item 6): the
driver's state file (rpeg.runtime.actors.state_file) gives back the transcript, the loss mask
with its holes, the attention over observations, the log-probs, the policy version and the
rollout's tool and environment-error metrics; the restore path's re-sharding (concat, select)
keeps them. The end-to-end kill-and-resume runs are tests/runtime/actors/
test_multiturn_resume.py (slow)."""

import dataclasses

import torch

from rpeg.runtime.actors.checkpoint import dumps, loads
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.data import Example
from rpeg.runtime.envs import tools as T
from rpeg.runtime.envs.rollout import multiturn_rollout
from rpeg.runtime.envs.runner import EnvRunner

from .scripted import BOS, EOS, ScriptedWorker, ch, multiturn

CALL = ch("<tool>calc(12*7)</tool>")  # 23 ids
BOOM = ch("<tool>calc(boom)</tool>")  # 23 ids: the tool raises (an error sample)


def _calc_or_raise(arg: str) -> str:
    if arg == "boom":
        raise RuntimeError("tool crashed")
    return "84"


def _rollout(monkeypatch):
    monkeypatch.setitem(T.TOOLS, "calc", T.Tool("calc", _calc_or_raise, "test"))
    w = ScriptedWorker(
        [
            # turn 1: row 0 calls the tool, row 1 answers (a BOS mid-turn), row 2 fails
            [(CALL, -0.25, False), ([BOS, *ch("84"), EOS], -0.5, True), (BOOM, -0.125, False)],
            # turn 2: row 0 answers after the observation
            [(ch("85") + [EOS], -0.75, True)],
        ]
    )
    runner = EnvRunner(timeout_s=2.0, concurrency=4)
    return multiturn_rollout(w, [Example("12x7?", "84")], 3, multiturn(), runner=runner)


def _equal(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype, f.name
            assert torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def test_a_buffered_multiturn_rollout_round_trips_through_a_checkpoint(monkeypatch):
    batch, metrics = _rollout(monkeypatch)
    # what RunCheckpoints.checkpoint writes for a slot in the buffer: the batches and, in the
    # step scheduler's state, the slot's rollout metrics
    driver = {"payloads": {2: [batch]}, "scheduler": {"rollout_metrics": {2: dict(metrics)}}}
    back = loads(dumps(driver))
    (got,) = back["payloads"][2]
    _equal(batch, got)
    assert back["scheduler"]["rollout_metrics"][2] == metrics
    # hand-worked: row 0 = call (23, trained) | <result>84</result> (19, not) | 85<eos> (3)
    assert got.response_mask[0].tolist() == [1] * 23 + [0] * 19 + [1] * 3
    assert got.response_attention[0].tolist() == [1] * 45
    assert got.sample_logprobs[0, 23:42].tolist() == [0.0] * 19
    assert got.response_mask[1].tolist() == [1] * 4 + [0] * 41  # BOS 8 4 EOS
    assert got.response_ids[1, :4].tolist() == [BOS, *ch("84"), EOS]
    assert got.response_mask[2].tolist() == [1] * 23 + [0] * 22  # the error sample's call
    assert got.policy_version.tolist() == [3, 3, 3]
    m = back["scheduler"]["rollout_metrics"][2]
    assert m["env_errors"] == 1.0 and m["env_error/env_error"] == 1.0
    assert m["tool_use_rate"] == 1 / 3 and m["turns_mean"] == 4 / 3


def test_the_restore_path_keeps_the_observations_and_the_mask(monkeypatch):
    """A restored slot goes to the trainer through RunData.put_sharded: the batches
    are joined and each data-parallel rank's rows selected, trimmed by the attention (not
    by the loss mask: an observation is never cut off)."""
    batch, _ = _rollout(monkeypatch)
    (got,) = loads(dumps({"payloads": {2: [batch]}}))["payloads"][2]
    first, rest = got.select([0]), got.select([1, 2])
    assert first.response_ids.shape[1] == 45  # the whole transcript of row 0
    assert first.response_mask[0].tolist() == [1] * 23 + [0] * 19 + [1] * 3
    assert first.attention_mask[0].sum() == 6 + 45  # BOS + "12x7?" and the transcript
    assert rest.response_ids.shape[1] == 23  # rows 1 (4 tokens) and 2 (23)
    joined = RolloutBatch.concat([first, rest])
    for name in ("response_ids", "response_mask", "response_attention", "sample_logprobs"):
        assert torch.equal(getattr(joined, name), getattr(batch, name)), name
    assert joined.responses == batch.responses


def test_the_rollout_marks_each_turns_environment_steps(monkeypatch):
    """Where the ``env`` fault point fires (rpeg.runtime.actors.fault_points.env_turn): before
    the environment steps of turn 1 (three rows act) and of turn 2 (row 0 answers)."""
    from rpeg.runtime.envs import rollout

    seen = []
    monkeypatch.setattr(rollout, "env_turn", seen.append)
    _rollout(monkeypatch)
    assert seen == [1, 2]
