"""Token rows of multi-turn transcripts: prompt, then segments trained or not.

What a rollout builds and what the warm-up trains on share this layout: the prompt's ids
(with BOS), then each segment's ids (no special tokens) in order, then EOS (trained). The
loss mask is 1 exactly on the trained segments and the EOS. With a chat template
(:class:`rpeg.runtime.envs.chat.ChatTurns`) the prompt is the rendered one and an untrained
segment (an observation) is its wrapper's ids, as in a rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rpeg.runtime.engines.torch_engine import left_pad


def transcript_ids(
    tokenizer,
    prompt: str,
    segments: Sequence[tuple[str, bool]],
    chat: Any = None,
    messages: Sequence[dict[str, str]] = (),
) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one transcript (the prompt's positions are 0 in the mask);
    ``chat``: the rollout's chat turns, ``messages`` the prompt's messages under them."""
    ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is not None and ids[:1] != [bos]:
        ids = [bos, *ids]
    loss = [0] * len(ids)
    earlier: list[str] = []
    for text, trained in segments:
        if chat is not None and not trained:  # an observation, wrapped as a message
            seg = chat.wrapper_ids(tokenizer, list(messages), earlier, text)
            earlier.append(text)
        else:
            seg = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += seg
        loss += [int(trained)] * len(seg)
    ids.append(tokenizer.eos_token_id)
    loss.append(1)
    return ids, loss


def transcript_batch(
    tokenizer,
    rows: Sequence[tuple[str, Sequence[tuple[str, bool]]]],
    chat: Any = None,
    messages: Sequence[Sequence[dict[str, str]]] = (),
):
    """``(ids [B,L], mask [B,L], loss_mask [B,L])``, left-padded; with ``chat``, row ``i``'s
    prompt messages are ``messages[i]``."""
    msgs = list(messages) or [()] * len(rows)
    built = [
        transcript_ids(tokenizer, p, segs, chat, m) for (p, segs), m in zip(rows, msgs, strict=True)
    ]
    ids, mask = left_pad([b[0] for b in built], tokenizer.pad_token_id)
    lm, _ = left_pad([b[1] for b in built], 0)
    return ids, mask, lm
