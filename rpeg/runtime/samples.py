"""Samples a person can read: ``samples.jsonl`` in the output folder.

Every ``runtime.log_samples_every`` steps (counted from 1, as the console counts) the step's
rows are appended as :class:`Sample` lines -- the prompt as the model got it (chat template
applied), the response as the rewards saw it (decoded without special tokens), the
reference answer, the reward and each reward rule's value, whether it was correct, the advantage, the response length
in tokens and the policy version that sampled it -- and a few are printed. Both runtimes
write the same lines: the single-process trainer from its batch, the distributed one from
the rows each data-parallel rank returns with its advantage unit (rows of tensor-parallel
peers are the same rows, kept once by ``index``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: rows a rank (or the single-process trainer) logs per logged step, whole groups first
MAX_SAMPLE_ROWS = 64
#: samples printed per logged step
PRINTED_SAMPLES = 2
SAMPLES_FILE = "samples.jsonl"


@dataclass(frozen=True)
class Sample:
    step: int  # 1-based, as the console counts
    index: int  # the row's position in the step's rollout
    prompt: str
    response: str
    reference_answer: str
    reward: float
    correct: float
    advantage: float  # the row's advantage (the mean over its response tokens)
    length: int  # response tokens
    policy_version: int
    # each reward rule's value (task.rewards), before any length penalty; ``reward`` is
    # their sum (after it)
    reward_per_rule: dict[str, float] = field(default_factory=dict)


def log_step(step: int, every: int) -> bool:
    """Is 0-based ``step`` a step whose samples are logged (every ``every``, from 1)?"""
    return every > 0 and (step + 1) % every == 0


def samples_from_batch(
    batch: Any, step: int, limit: int = MAX_SAMPLE_ROWS, rules: Sequence[str] = ()
) -> tuple[Sample, ...]:
    """The first ``limit`` rows of ``batch`` (0-based ``step``) as samples; ``rules``: the
    reward rules' names, in the order of the batch's ``reward_parts`` columns."""
    n = min(batch.size, limit)
    if n == 0:
        return ()
    lengths = batch.response_lengths[:n].tolist()
    mask = batch.response_mask[:n].float()
    adv = [0.0] * n
    if batch.advantages is not None:
        adv = ((batch.advantages[:n].float() * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()
    rew = batch.rewards[:n].tolist() if batch.rewards is not None else [0.0] * n
    cor = batch.correct[:n].tolist() if batch.correct is not None else [0.0] * n
    idx = batch.sample_index[:n].tolist() if batch.sample_index is not None else list(range(n))
    ver = batch.policy_version[:n].tolist()
    parts = getattr(batch, "reward_parts", None)
    per: list[dict[str, float]] = [{} for _ in range(n)]
    if parts is not None and rules and parts.shape[1] == len(rules):
        per = [dict(zip(rules, map(float, row), strict=True)) for row in parts[:n].tolist()]
    return tuple(
        Sample(
            step=step + 1,
            index=int(idx[i]),
            prompt=batch.prompts[i],
            response=batch.responses[i],
            reference_answer=batch.reference_answers[i],
            reward=float(rew[i]),
            correct=float(cor[i]),
            advantage=float(adv[i]),
            length=int(lengths[i]),
            policy_version=int(ver[i]),
            reward_per_rule=per[i],
        )
        for i in range(n)
    )


def merge(samples: Iterable[Sample]) -> list[Sample]:
    """One sample per row (tensor-parallel peers return the same rows), in row order."""
    seen: dict[tuple[int, int], Sample] = {}
    for s in samples:
        seen.setdefault((s.step, s.index), s)
    return [seen[k] for k in sorted(seen)]


def append_samples(out_dir: str | Path, samples: Sequence[Sample]) -> Path:
    """Append ``samples`` to ``<out_dir>/samples.jsonl``; the path."""
    path = Path(out_dir) / SAMPLES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    from rpeg.runtime.run_folder import append_lines

    append_lines(path, [json.dumps(asdict(s)) for s in samples])  # whole lines, one write
    return path


def keep_samples_upto(out_dir: str | Path, steps_done: int) -> int:
    """A run resumed or recovered from a checkpoint after ``steps_done`` steps logs the
    later steps again when it recomputes them: their rows from before the interruption are
    dropped from ``samples.jsonl`` (as ``metrics.jsonl`` replaces their lines), so that
    every step's rows appear once. Returns how many were dropped; a line that does not
    parse is kept."""
    path = Path(out_dir) / SAMPLES_FILE
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    keep = [x for x in lines if not _after(x, steps_done)]
    if len(keep) < len(lines):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(x + "\n" for x in keep))
        os.replace(tmp, path)
    return len(lines) - len(keep)


def _after(line: str, steps_done: int) -> bool:
    try:
        return int(json.loads(line)["step"]) > steps_done
    except (ValueError, KeyError, TypeError):
        return False


def read_samples(path: str | Path) -> list[Sample]:
    with open(path) as fh:
        return [Sample(**json.loads(line)) for line in fh if line.strip()]


def _short(text: str, n: int = 80) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else "..." + text[-(n - 3) :]


#: a chat template's markup: special tokens (``<|im_start|>``, ``<|eot_id|>``, ``<s>``),
#: Mistral/Llama-2 instruction marks
_MARKUP = re.compile(r"<\|[^|<>]{1,40}\|>|</?s>|\[/?INST\]|<<(?:/)?SYS>>")
_ROLE = re.compile(r"^\s*(system|user|assistant|human|gpt|developer)\s*(\n|$)", re.IGNORECASE)


def question(prompt: str) -> str:
    """The question of a templated prompt: the last message's text between the chat
    template's markup (ChatML, Llama 3, Mistral), its role line left out; a prompt without
    such markup as it is."""
    parts = _MARKUP.split(prompt)
    if len(parts) == 1:
        return prompt
    texts = [_ROLE.sub("", x, count=1).strip() for x in parts]
    texts = [x for x in texts if x]
    return texts[-1] if texts else prompt.strip()


def _quoted(text: str, n: int = 80, head: bool = False) -> str:
    """``text`` in quotes, newlines as one ``\\n``, cut to ``n`` characters (its start with
    ``head``, else its end)."""
    text = text.replace("\n", "\\n")
    if len(text) > n:
        text = text[: n - 3] + "..." if head else "..." + text[-(n - 3) :]
    return f'"{text}"'


def sample_lines(samples: Sequence[Sample], n: int = PRINTED_SAMPLES) -> list[str]:
    """A few samples as console lines: the prompt's question (not its template's tail), the
    end of the response, the reference answer."""
    return [
        f"  sample step {s.step} #{s.index}: reward {s.reward:.2f} adv {s.advantage:+.2f} "
        f"| prompt {_quoted(question(s.prompt), 100, head=question(s.prompt) != s.prompt)} "
        f"| response {_quoted(s.response)} | answer {_quoted(s.reference_answer)}"
        for s in samples[:n]
    ]


def table_rows(samples: Sequence[Sample], n: int = 16) -> list[dict[str, Any]]:
    """Rows of a table artifact (text shortened; a column ``reward/<rule>`` per rule)."""
    rows = []
    for s in samples[:n]:
        row = {**asdict(s), "prompt": _short(s.prompt, 200), "response": _short(s.response, 200)}
        row.pop("reward_per_rule")
        rows.append(row | {f"reward/{k}": v for k, v in s.reward_per_rule.items()})
    return rows
