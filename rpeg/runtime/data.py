"""Prompts and reference answers: synthetic tasks, JSONL/Parquet files, and a resumable cursor.

* :class:`ArithmeticSource` / :class:`CountdownSource`: seeded, infinite, indexable generators
  with difficulty levels (1 = easiest); example ``i`` depends only on ``(seed, i)``.
* :func:`load_examples`: JSONL or Parquet from any fsspec URL, GSM8K format
  (``question``, ``answer`` with the final answer after ``####``).
* :class:`DataCursor`: hands out prompt batches; ``state_dict()`` / ``load_state_dict()``
  resume exactly where it stopped (finite datasets are reshuffled per epoch with a seeded order).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.answers import parse_rational
from rpeg.runtime.datasets.files import (  # MAX_ROW_PROBLEMS etc.: the data API in one place
    MAX_ROW_PROBLEMS,  # noqa: F401
    ChatMessage,
    RowKeys,
    check_examples,  # noqa: F401
    gsm8k_final_answer,  # noqa: F401
    load_row_texts,
)


@dataclass(frozen=True)
class Example:
    question: str  # the prompt's text (chat data: the last user message)
    answer: str  # the reference answer handed to rewards
    solution: str = ""  # a worked target for supervised warm-up ("" = use answer)
    messages: tuple[ChatMessage, ...] = ()  # chat data: the prompt's messages
    system_prompt: str = ""  # task.system_prompt (put before prompts without one)
    rendered: str = ""  # the exact prompt text (chat template applied); "" = not rendered
    data_source: str = ""  # the row's data_source column (verl); "" = none (rewards by source)

    def prompt(self, template: str = "{question}") -> str:
        """The text the model gets: the rendered prompt when there is one
        (rpeg.runtime.datasets.prompts), else ``template`` filled with the question."""
        if self.rendered:
            return self.rendered
        if not self.messages and not self.system_prompt:
            return template.format(question=self.question)
        texts = [m.content for m in self.messages] or [template.format(question=self.question)]
        has_system = any(m.role == "system" for m in self.messages)
        head = [self.system_prompt] if self.system_prompt and not has_system else []
        return "\n\n".join(head + texts)

    @property
    def target(self) -> str:
        return self.solution or self.answer


@dataclass(frozen=True)
class PromptShard:
    """The prompts of one step a data-parallel rank generates for: ``examples``, prompts
    ``first .. first + len(examples) - 1`` of the step's batch (their rows are sampled from
    the seeds those positions have in the whole batch: engines.row_sampling)."""

    first: int
    examples: tuple[Example, ...]


# --- synthetic sources ---------------------------------------------------------------------
def _rng(seed: int, index: int, salt: int) -> random.Random:
    return random.Random((seed * 1_000_003 + index) * 31 + salt)


class ArithmeticSource:
    """``"a+b="`` style problems; the response is the number then EOS.

    difficulty 1: a+b, a,b in [0, 20); 2: a+b in [0, 100); 3: a+b or a-b in [0, 100);
    4: a*b in [0, 20) or a+b in [0, 1000); 5: a+b+c / a*b+c / a-b-c in [0, 100).
    """

    kind = "arithmetic"

    def __init__(
        self, difficulty: int = 1, seed: int = 0, exclude: Sequence[str] = (), salt: int = 0
    ):
        if not 1 <= difficulty <= 5:
            raise ConfigError([Problem("task.difficulty", f"must be 1..5 (got {difficulty})")])
        self.difficulty, self.seed, self.salt = difficulty, seed, salt
        self.exclude = frozenset(exclude)

    def __len__(self) -> int | None:  # infinite
        return None

    def _make(self, rng: random.Random) -> tuple[str, int]:
        d = self.difficulty
        if d == 1:
            a, b = rng.randrange(20), rng.randrange(20)
            return f"{a}+{b}=", a + b
        if d == 2:
            a, b = rng.randrange(100), rng.randrange(100)
            return f"{a}+{b}=", a + b
        if d == 3:
            a, b = rng.randrange(100), rng.randrange(100)
            return (f"{a}+{b}=", a + b) if rng.random() < 0.5 else (f"{a}-{b}=", a - b)
        if d == 4:
            if rng.random() < 0.5:
                a, b = rng.randrange(20), rng.randrange(20)
                return f"{a}*{b}=", a * b
            a, b = rng.randrange(1000), rng.randrange(1000)
            return f"{a}+{b}=", a + b
        a, b, c = rng.randrange(100), rng.randrange(100), rng.randrange(100)
        form = rng.randrange(3)
        if form == 0:
            return f"{a}+{b}+{c}=", a + b + c
        if form == 1:
            a, b = a % 20, b % 20
            return f"{a}*{b}+{c}=", a * b + c
        return f"{a}-{b}-{c}=", a - b - c

    def __getitem__(self, index: int) -> Example:
        rng = _rng(self.seed, index, self.salt)
        for _ in range(1000):
            q, a = self._make(rng)
            if q not in self.exclude:
                return Example(q, str(a))
        raise ConfigError(
            [Problem("task", "held-out set covers the whole problem space; lower heldout_size")]
        )


class CountdownSource:
    """Countdown: reach a target with ``+ - *`` over the given numbers (each at most once).

    The reference answer is ``"target|n1,n2,..."`` (see the ``countdown`` reward); difficulty
    sets how many numbers (difficulty + 1) and their range.
    """

    kind = "countdown"

    def __init__(
        self, difficulty: int = 1, seed: int = 0, exclude: Sequence[str] = (), salt: int = 0
    ):
        self.difficulty, self.seed, self.salt = difficulty, seed, salt
        self.exclude = frozenset(exclude)

    def __len__(self) -> int | None:
        return None

    def __getitem__(self, index: int) -> Example:
        rng = _rng(self.seed, index, self.salt + 7)
        n = self.difficulty + 1
        hi = 10 if self.difficulty <= 2 else 25
        for _ in range(1000):
            nums = [rng.randrange(1, hi) for _ in range(n)]
            expr = str(nums[0])
            for x in nums[1:]:
                expr = (
                    f"({expr}{rng.choice('+-*')}{x})"
                    if len(expr) > 2
                    else f"{expr}{rng.choice('+-*')}{x}"
                )
            target = int(parse_rational(expr))  # no eval, even of our own expressions
            q = f"{','.join(map(str, nums))}->{target}:"
            if q not in self.exclude:
                return Example(q, f"{target}|{','.join(map(str, nums))}", solution=expr)
        raise ConfigError(
            [Problem("task", "held-out set covers the whole problem space; lower heldout_size")]
        )


# --- files (rpeg.runtime.datasets.files reads them) ------------------------------------------
def load_examples(
    url: str, kind: str | None = None, keys: RowKeys = RowKeys(), where: str = "task.url"
) -> list[Example]:
    """Read a data file (local path or fsspec URL) into examples; every bad row (up to
    ``MAX_ROW_PROBLEMS``) is reported at once (rpeg.runtime.datasets.files)."""
    return [
        Example(
            r.question, r.answer, r.solution, r.messages, r.system_prompt, data_source=r.data_source
        )
        for r in load_row_texts(url, kind, keys, where)
    ]


def check_template(template: str, where: str = "task.prompt_template") -> list[Problem]:
    """A prompt template may use ``{question}`` only (``{{`` / ``}}`` for literal braces), with
    no format spec or conversion (``{question:>300000000}`` passed and aborted the tokenizer)."""
    import string

    try:
        parsed = [x for x in string.Formatter().parse(template) if x[1] is not None]
        fields = [f for _, f, _, _ in parsed]
    except ValueError as exc:
        return [Problem(where, f"not a valid template: {exc} (use {{{{ and }}}} for braces)")]
    bad = sorted({f for f in fields if f != "question"})
    if bad:
        return [Problem(where, f"unknown placeholder(s) {bad}; allowed: {{question}}")]
    specs = [f"{{{f}{'!' + c if c else ''}{':' + s if s else ''}}}" for _, f, s, c in parsed]
    specs = [x for x in specs if x != "{question}"]
    if specs:  # a width like {question:>300000000} builds a 300 MB prompt
        return [Problem(where, f"{specs[0]}: no format spec or conversion; write {{question}}")]
    return []


# --- the cursor ----------------------------------------------------------------------------
class DataCursor:
    """Hands out examples in order; finite datasets are reshuffled every epoch (seeded)."""

    def __init__(
        self,
        source: Sequence[Example] | ArithmeticSource | CountdownSource,
        seed: int = 0,
        shuffle: bool = True,
    ):
        self.source = source
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order: list[int] | None = None

    @property
    def finite(self) -> bool:
        return isinstance(self.source, list | tuple)

    def _order_for_epoch(self) -> list[int]:
        if self._order is None:
            idx = list(range(len(self.source)))
            if self.shuffle:
                random.Random(self.seed * 7919 + self.epoch).shuffle(idx)
            self._order = idx
        return self._order

    def next(self, n: int) -> list[Example]:
        out: list[Example] = []
        while len(out) < n:
            if not self.finite:
                out.append(self.source[self.position])
                self.position += 1
                continue
            order = self._order_for_epoch()
            if self.position >= len(order):
                self.epoch += 1
                self.position = 0
                self._order = None
                continue
            out.append(self.source[order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self.seed = (
            int(state["epoch"]),
            int(state["position"]),
            int(state["seed"]),
        )
        self._order = None


def distinct_heldout(source, n: int) -> tuple[list[Example], set[str]]:
    """The first ``n`` examples of a synthetic ``source`` with distinct questions (at most
    ``50 n`` draws), and those questions: the training source is built to exclude them."""
    heldout: list[Example] = []
    seen: set[str] = set()
    i = 0
    while len(heldout) < n and i < 50 * max(n, 1):
        ex = source[i]
        i += 1
        if ex.question not in seen:
            seen.add(ex.question)
            heldout.append(ex)
    return heldout, seen
