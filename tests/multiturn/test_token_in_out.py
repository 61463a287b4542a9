"""Token in, token out: a multi-turn sample is the generated ids plus the observation ids,
exactly; the loss mask covers the model's own tokens only. Expected ids worked by hand from
the char vocabulary (tests/multiturn/scripted.ch)."""

import pytest
import torch

from rpeg.runtime.data import Example
from rpeg.runtime.envs.answers import final_answer_reward
from rpeg.runtime.envs.rollout import find_subsequence, multiturn_rollout

from .scripted import BOS, EOS, ScriptedWorker, ch, multiturn

CALL = ch("<tool>calc(12*7)</tool>")  # 23 ids
OBS = ch("<result>84</result>")  # 19 ids


def _rollout():
    w = ScriptedWorker(
        [
            # call 1: row 0 calls the tool (then babbles "zz", dropped); row 1 answers 85
            [(CALL + ch("zz"), -0.25, False), (ch("85") + [EOS], -0.75, True)],
            # call 2 (row 0 only): a BOS the text would lose, then 84 and EOS
            [([BOS, *ch("84"), EOS], -0.5, True)],
        ]
    )
    batch, m = multiturn_rollout(w, [Example("12x7?", "84")], 2, multiturn(), seed=5)
    return w, batch, m


def test_ids_and_masks_across_turns():
    w, batch, m = _rollout()
    prompt = [BOS, *ch("12x7?")]
    want0 = CALL + OBS + [BOS, *ch("84"), EOS]  # 23 + 19 + 4 = 46
    want1 = ch("85") + [EOS]
    assert batch.response_ids.shape == (2, 46)
    assert batch.response_ids[0].tolist() == want0
    assert batch.response_ids[1, :3].tolist() == want1
    assert batch.response_ids[1, 3:].eq(0).all()
    assert batch.response_mask[0].tolist() == [1] * 23 + [0] * 19 + [1] * 4
    assert batch.response_mask[1].tolist() == [1] * 3 + [0] * 43
    assert batch.response_attention[0].tolist() == [1] * 46
    assert batch.response_attention[1].tolist() == [1] * 3 + [0] * 43
    assert batch.sample_logprobs[0].tolist() == [-0.25] * 23 + [0.0] * 19 + [-0.5] * 4
    assert batch.sample_logprobs[1, :3].tolist() == [-0.75] * 3
    # the second call got the ids so far, as ids: prompt + call + observation
    assert w.calls[0] == ([prompt, prompt], [28, 28])
    assert w.calls[1] == ([prompt + CALL + OBS], [22])  # min(28, 64 - 42)
    assert batch.prompt_ids.tolist() == [prompt, prompt]
    assert batch.attention_mask[0].tolist() == [1] * (6 + 46)
    assert batch.policy_version.tolist() == [3, 3]
    # text for rewards only: the BOS is gone from it, not from the ids
    assert batch.responses[0] == "<tool>calc(12*7)</tool><result>84</result>84"
    assert [final_answer_reward("", r, "84") for r in batch.responses] == [1.0, 0.0]
    assert m["tool_use_rate"] == 0.5
    assert m["turns_mean"] == 1.5
    assert m["env_reward_mean"] == 0.5  # row 0's final answer is right, row 1's is not
    assert m["env_errors"] == 0.0


def test_turn_shape_metrics_by_hand():
    """What `rpeg calibrate` fits the turn shape from: the engine decoded 25 ids (the call
    and the dropped "zz") + 4 in row 0's two turns and 3 in row 1's one turn: 32 / 3 per
    turn; one observation of 19 ids."""
    _, _, m = _rollout()
    assert m["turn_tokens_mean"] == pytest.approx(32 / 3)
    assert m["observation_tokens_mean"] == 19.0
    # no observation in the step: no observation figure (not a 0 that would be averaged in)
    w = ScriptedWorker([[(ch("85") + [EOS], -0.75, True)]])
    _, m = multiturn_rollout(w, [Example("12x7?", "84")], 1, multiturn())
    assert m["turn_tokens_mean"] == 3.0 and "observation_tokens_mean" not in m


def test_select_keeps_observation_columns():
    _, batch, _ = _rollout()
    one = batch.select([0])
    assert one.response_ids.shape == (1, 46)  # 27 trained tokens, 46 in the transcript
    assert batch.select([1]).response_ids.shape == (1, 3)


def test_turn_cap_and_max_turns():
    # the turn runs out of tokens: the sample ends (counted), the env is not called
    w = ScriptedWorker([[(ch("12345"), -0.1, False)]])
    _, m = multiturn_rollout(w, [Example("q", "1")], 1, multiturn(max_turn_tokens=5))
    assert m["mt_end/turn_tokens"] == 1.0
    # a tool call on the last turn: no observation is appended, the sample ends
    w = ScriptedWorker([[(CALL, -0.1, False)]])
    b, m = multiturn_rollout(w, [Example("q", "84")], 1, multiturn(max_turns=1))
    assert b.response_ids[0].tolist() == CALL
    assert m["mt_end/max_turns"] == 1.0 and m["tool_use_rate"] == 1.0


def test_sample_cap_leaves_no_room_for_the_observation():
    # 23 generated + 19 observation ids >= a 40-token sample cap: ended before appending
    w = ScriptedWorker([[(CALL, -0.1, False)]], max_new_tokens=40)
    b, m = multiturn_rollout(w, [Example("q", "84")], 1, multiturn())
    assert b.response_ids[0].tolist() == CALL
    assert m["mt_end/sample_tokens"] == 1.0


def test_find_subsequence():
    assert find_subsequence([5, 1, 2, 3, 1, 2], [1, 2]) == 3
    assert find_subsequence([1, 3], [1, 2]) is None
    assert find_subsequence([1, 2], []) is None


def test_trainer_sees_observations_and_masks_them():
    """compute_logprobs over a multi-turn batch: on the model's tokens, the log-probs of a
    plain forward over the whole transcript (observations attended); 0 elsewhere."""
    from rpeg.config import RunConfig
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.roles import PolicyWorker

    _, batch, _ = _rollout()
    c = RunConfig()
    model, tok = create_tiny(seed=0)
    worker = PolicyWorker(
        model, tok, algorithm=c.algorithm, optim=c.optim, workload=c.workload, seed=0
    )
    lp = worker.compute_logprobs(batch)
    full = torch.tensor([batch.prompt_ids[0].tolist() + batch.response_ids[0].tolist()])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0].float()
    p = batch.prompt_ids.shape[1]
    ref = logits[p - 1 : -1].log_softmax(-1).gather(-1, full[0, p:, None]).squeeze(-1)
    mask = batch.response_mask[0].bool()
    assert torch.allclose(lp[0][mask], ref[mask], atol=1e-4)
    assert lp[0][~mask].eq(0).all()
