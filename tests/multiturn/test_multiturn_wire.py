"""A multi-turn batch crosses the distributed runtime's wire (the Dask serializer) intact:
observation ids, the loss mask with its holes and the attention mask come back equal."""

import torch

from rpeg.runtime.actors.serializers import batch_from_frames, batch_to_frames
from rpeg.runtime.data import Example
from rpeg.runtime.envs.rollout import multiturn_rollout

from .scripted import BOS, EOS, ScriptedWorker, ch, multiturn


def test_round_trip_keeps_observations_and_masks():
    call = ch("<tool>calc(12*7)</tool>")
    w = ScriptedWorker(
        [
            [(call, -0.25, False), (ch("85") + [EOS], -0.75, True)],
            [([BOS, *ch("84"), EOS], -0.5, True)],
        ]
    )
    batch, _ = multiturn_rollout(w, [Example("12x7?", "84")], 2, multiturn())
    header, frames = batch_to_frames(batch)
    back = batch_from_frames(header, frames)
    for name in ("response_ids", "response_mask", "response_attention", "sample_logprobs"):
        assert torch.equal(getattr(back, name), getattr(batch, name)), name
    assert back.attention_mask[0].sum() == 6 + 23 + 19 + 4  # prompt, call, result, answer
    assert back.responses == batch.responses
