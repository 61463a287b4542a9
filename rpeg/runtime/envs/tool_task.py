"""The built-in tool task: arithmetic word problems the model may solve with ``calc``.

``task.kind: tool_arithmetic``. A problem reads ``"37 boxes of 24 pens. Pens?"``; its
reference answer is the number (888). The model may answer at once (``888<eos>``) or call
the calculator first (``<tool>calc(37*24)</tool>``, the environment appends
``<result>888</result>``, then ``888<eos>``). Numbers are two- and three-digit, which the
built-in tiny model cannot multiply or add by itself: the tool is how it gets them right.

Warm-up (supervised, before RL): transcripts of both kinds, ``task.multiturn.
warmup_tool_share`` of them with the tool, the loss only on the model's own tokens (the
observation is input, never a target) -- the same token layout a rollout produces, chat
template included (``task.multiturn.chat_template``: the prompt rendered, the observation
wrapped as a message).

difficulty 1: ``a*b`` with a in [2, 10), b in [10, 100); 2: also ``a+b`` and ``a-b`` with
a, b in [100, 1000); 3..5: ``a*b`` with both in [10, 100) and three-digit sums.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.data import DataCursor, Example, distinct_heldout
from rpeg.runtime.envs.tools import RESULT_CLOSE, RESULT_OPEN, TOOL_CLOSE, TOOL_OPEN

_FORMS = {
    "*": "{a} boxes of {b} pens. Pens?",
    "+": "{a} pens and {b} more. Pens?",
    "-": "{a} pens, {b} lost. Pens left?",
}


def tool_transcript(ex: Example) -> list[tuple[str, bool]]:
    """The tool-using transcript of ``ex`` as ``(text, trained)`` segments after the prompt:
    the call (trained), the environment's observation (not trained), the answer (trained;
    the EOS follows)."""
    return [
        (f"{TOOL_OPEN}calc({ex.solution}){TOOL_CLOSE}", True),
        (f"{RESULT_OPEN}{ex.answer}{RESULT_CLOSE}", False),
        (ex.answer, True),
    ]


class ToolArithmeticSource:
    """Seeded, infinite, indexable word problems (example ``i`` depends on ``(seed, i)``)."""

    kind = "tool_arithmetic"

    def __init__(
        self,
        difficulty: int = 1,
        seed: int = 0,
        exclude: Sequence[str] = (),
        salt: int = 0,
        tool_share: float = 0.5,
        chat_template: str = "none",
        observation_role: str = "tool",
    ):
        if not 1 <= difficulty <= 5:
            raise ConfigError([Problem("task.difficulty", f"must be 1..5 (got {difficulty})")])
        self.difficulty, self.seed, self.salt = difficulty, seed, salt
        self.exclude = frozenset(exclude)
        self.tool_share = tool_share
        self.chat_template, self.observation_role = chat_template, observation_role

    def __len__(self) -> int | None:  # infinite
        return None

    def _make(self, rng: random.Random) -> tuple[str, str, int]:
        d = self.difficulty
        op = "*" if d == 1 else rng.choice("*+-")
        if op == "*":
            a = rng.randrange(2, 10) if d <= 2 else rng.randrange(10, 100)
            b = rng.randrange(10, 100)
            v = a * b
        else:
            a, b = rng.randrange(100, 1000), rng.randrange(100, 1000)
            if op == "-" and b > a:
                a, b = b, a
            v = a + b if op == "+" else a - b
        return _FORMS[op].format(a=a, b=b), f"{a}{op}{b}", v

    def __getitem__(self, index: int) -> Example:
        rng = random.Random((self.seed * 1_000_003 + index) * 31 + self.salt + 13)
        for _ in range(1000):
            q, expr, v = self._make(rng)
            if q not in self.exclude:
                return Example(q, str(v), solution=expr)
        raise ConfigError(
            [Problem("task", "held-out set covers the whole problem space; lower heldout_size")]
        )

    def uses_tool(self, ex: Example) -> bool:
        """Whether the warm-up shows ``ex`` solved with the tool (fixed per question)."""
        h = zlib.crc32(f"{self.seed}:{ex.question}".encode()) / 2**32
        return h < self.tool_share

    def sft_batch(self, tokenizer, examples: list[Example], template: str):
        """(ids, mask, loss_mask) of warm-up transcripts: what ``rpeg.runtime.warmup`` trains
        on for a source that has this method."""
        from rpeg.runtime.envs.chat import ChatTurns
        from rpeg.runtime.envs.transcripts import transcript_batch

        chat = ChatTurns.choose(self.chat_template, self.observation_role, tokenizer)
        rows, messages = [], []
        for ex in examples:
            segs = tool_transcript(ex) if self.uses_tool(ex) else [(ex.answer, True)]
            prompt = ex.prompt(template)
            if chat is not None:  # as the rollout renders it (rpeg.runtime.envs.rollout)
                messages.append(chat.prompt_messages(ex, prompt))
                prompt = chat.prompt_text(tokenizer, messages[-1])
            rows.append((prompt, segs))
        return transcript_batch(tokenizer, rows, chat, messages)


def tool_task_data(task) -> tuple[DataCursor, list[Example]]:
    """(training cursor, held-out examples) of ``task.kind: tool_arithmetic``."""
    share = task.multiturn.warmup_tool_share
    held_src = ToolArithmeticSource(task.difficulty, task.seed, salt=99_991)
    heldout, seen = distinct_heldout(held_src, task.heldout_size)
    mt = task.multiturn
    train = ToolArithmeticSource(
        task.difficulty,
        task.seed,
        exclude=seen,
        tool_share=share,
        chat_template=mt.chat_template,
        observation_role=mt.observation_role,
    )
    return DataCursor(train, seed=task.seed), heldout
