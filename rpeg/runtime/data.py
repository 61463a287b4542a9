"""Prompts and reference answers: synthetic tasks, JSONL/Parquet files, and a resumable cursor.

* :class:`ArithmeticSource` / :class:`CountdownSource`: seeded, infinite, indexable generators
  with difficulty levels (1 = easiest); example ``i`` depends only on ``(seed, i)``.
* :func:`load_examples`: JSONL or Parquet from any fsspec URL, GSM8K format
  (``question``, ``answer`` with the final answer after ``####``).
* :class:`DataCursor`: hands out prompt batches; ``state_dict()`` / ``load_state_dict()``
  resume exactly where it stopped (finite datasets are reshuffled per epoch with a seeded order).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rpeg.errors import ConfigError, Problem


@dataclass(frozen=True)
class Example:
    question: str
    answer: str  # the reference answer handed to rewards
    solution: str = ""  # a worked target for supervised warm-up ("" = use answer)

    def prompt(self, template: str = "{question}") -> str:
        return template.format(question=self.question)

    @property
    def target(self) -> str:
        return self.solution or self.answer


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
            target = eval(expr)  # noqa: S307 - built from our own digits and operators
            q = f"{','.join(map(str, nums))}->{target}:"
            if q not in self.exclude:
                return Example(q, f"{target}|{','.join(map(str, nums))}", solution=expr)
        raise ConfigError(
            [Problem("task", "held-out set covers the whole problem space; lower heldout_size")]
        )


# --- files ---------------------------------------------------------------------------------
def gsm8k_final_answer(answer: str) -> str:
    """GSM8K: the final answer follows ``####``."""
    return (
        answer.rsplit("####", 1)[1].strip().replace(",", "") if "####" in answer else answer.strip()
    )


def _row_to_example(row: dict[str, Any], where: str) -> Example:
    q = row.get("question", row.get("problem", row.get("prompt")))
    a = row.get("answer", row.get("solution"))
    if q is None or a is None:
        raise ConfigError(
            [Problem(where, f"row needs 'question' and 'answer' fields (got {sorted(row)})")]
        )
    a = str(a)
    return Example(str(q), gsm8k_final_answer(a), solution=a)


def load_examples(url: str, kind: str | None = None) -> list[Example]:
    """Read a JSONL or Parquet file (local path or fsspec URL) into examples."""
    import fsspec

    kind = kind or ("parquet" if url.endswith(".parquet") else "jsonl")
    try:
        if kind == "parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ConfigError(
                    [
                        Problem(
                            "task.url",
                            "reading Parquet needs pyarrow (pip install pyarrow), or use JSONL",
                        )
                    ]
                ) from None
            with fsspec.open(url, "rb") as fh:
                rows = pq.read_table(fh).to_pylist()
        else:
            rows = []
            with fsspec.open(url, "r") as fh:
                for i, line in enumerate(fh):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as exc:
                            raise ConfigError(
                                [Problem(f"{url}:{i + 1}", f"not valid JSON: {exc}")]
                            ) from None
    except FileNotFoundError:
        raise ConfigError([Problem("task.url", f"file {url!r} not found")]) from None
    if not rows:
        raise ConfigError([Problem("task.url", f"{url!r} holds no examples")])
    return [_row_to_example(r, f"{url}:{i + 1}") for i, r in enumerate(rows)]


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


def build_task_data(task) -> tuple[DataCursor, list[Example]]:
    """(training cursor, held-out examples) for a :class:`rpeg.config.TaskConfig`."""
    if task.kind in ("arithmetic", "countdown"):
        cls = ArithmeticSource if task.kind == "arithmetic" else CountdownSource
        held_src = cls(task.difficulty, task.seed, salt=99_991)
        heldout: list[Example] = []
        seen: set[str] = set()
        i = 0
        while len(heldout) < task.heldout_size and i < 50 * max(task.heldout_size, 1):
            ex = held_src[i]
            i += 1
            if ex.question not in seen:
                seen.add(ex.question)
                heldout.append(ex)
        train = cls(task.difficulty, task.seed, exclude=seen)
        return DataCursor(train, seed=task.seed), heldout
    examples = load_examples(task.url, task.kind)
    k = min(task.heldout_size, len(examples) // 2)
    rng = random.Random(task.seed)
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    heldout = [examples[i] for i in idx[:k]]
    train = [examples[i] for i in idx[k:]]
    return DataCursor(train, seed=task.seed), heldout
