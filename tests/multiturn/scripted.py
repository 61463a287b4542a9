"""A scripted policy worker for multi-turn rollout tests: each generate call returns the
next scripted turn of every active row, and records the ids it was given."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rpeg.runtime.engines.base import GenerationOutput, SamplingParams
from rpeg.runtime.tokenizer import build_char_tokenizer

BOS, EOS, PAD = 1, 2, 0


def ch(text: str) -> list[int]:
    """The char tokenizer's ids worked by hand: 4 special tokens, then newline (4), then
    printable ASCII from space (5): id = ord(c) - 27."""
    return [4 if c == "\n" else ord(c) - 27 for c in text]


class ScriptedWorker:
    def __init__(self, turns: list[list[tuple[list[int], float, bool]]], max_new_tokens=64):
        """``turns[k][j]``: the k-th generate call's row j as (ids, log-prob of each, stopped)."""
        self.tokenizer = build_char_tokenizer()
        self.lm = None
        self.engine = SimpleNamespace(policy_version=3)
        self.turns = turns
        self.max_new_tokens = max_new_tokens
        self.calls: list[tuple[list[list[int]], list[int]]] = []

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=1.0)

    def encode_prompts(self, texts):
        return [[BOS, *ch(t)] for t in texts]

    def generate(self, prompt_ids, params, *, seed=None, max_new_tokens=None):
        self.calls.append(([list(p) for p in prompt_ids], list(max_new_tokens)))
        rows = self.turns[len(self.calls) - 1]
        assert len(rows) == len(prompt_ids)
        width = max(len(r[0]) for r in rows)
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        lps = torch.zeros((len(rows), width))
        for j, (r, lp, _) in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(r)
            lps[j, : len(r)] = lp
        return GenerationOutput(
            response_ids=ids,
            logprobs=lps,
            lengths=torch.tensor([len(r[0]) for r in rows]),
            finished=torch.tensor([r[2] for r in rows]),
        )


def multiturn(**kw):
    base = dict(
        env="tools",
        tools=["calc"],
        max_turns=3,
        max_turn_tokens=28,
        env_timeout_s=2.0,
        env_concurrency=4,
        warmup_tool_share=0.5,
        chat_template="auto",
        observation_role="tool",
    )
    return SimpleNamespace(**{**base, **kw})
