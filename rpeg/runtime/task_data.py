"""A task's data as training gets it: :func:`build_task_data` turns a
:class:`rpeg.config.TaskConfig` into (training cursor, held-out examples) from the synthetic
sources and files of :mod:`rpeg.runtime.data` or the multi-turn tool task of
:mod:`rpeg.runtime.envs.tool_task` (apart from both so neither imports the other)."""

from __future__ import annotations

import random
from typing import Any

from rpeg.runtime.data import (
    ArithmeticSource,
    CountdownSource,
    DataCursor,
    Example,
    distinct_heldout,
    load_examples,
)
from rpeg.runtime.datasets.files import RowKeys
from rpeg.runtime.envs.tool_task import tool_task_data


def build_task_data(
    task, tokenizer: Any = None, max_prompt_tokens: int | None = None, log: Any = None
) -> tuple[DataCursor, list[Example]]:
    """(training cursor, held-out examples) for a :class:`rpeg.config.TaskConfig`.

    With the policy's ``tokenizer`` every prompt is rendered as the model gets it
    (``task.chat_template``, ``task.system_prompt``: rpeg.runtime.datasets.prompts) and a
    file's prompts over ``max_prompt_tokens`` are handled per ``task.overlong`` (filtered,
    truncated, or an error); ``log`` gets one line saying what was done."""
    from rpeg.runtime.datasets.prompts import RenderedSource, prompt_format, render_examples

    fmt = prompt_format(task, tokenizer) if tokenizer is not None else None
    if task.kind == "tool_arithmetic":  # the multi-turn tool task (rpeg.runtime.envs)
        return tool_task_data(task)
    if task.kind in ("arithmetic", "countdown"):
        cls = ArithmeticSource if task.kind == "arithmetic" else CountdownSource
        held_src = cls(task.difficulty, task.seed, salt=99_991)
        heldout, seen = distinct_heldout(held_src, task.heldout_size)
        train = cls(task.difficulty, task.seed, exclude=seen)
        if fmt is not None and (fmt.chat or task.system_prompt):
            rendered = RenderedSource(train, tokenizer, fmt)
            heldout = [rendered.render(ex) for ex in heldout]
            return DataCursor(rendered, seed=task.seed), heldout
        return DataCursor(train, seed=task.seed), heldout
    examples = load_examples(task.url, task.kind, RowKeys.from_task(task))
    if fmt is not None:
        examples, report = render_examples(
            examples,
            tokenizer,
            fmt,
            max_prompt_tokens=max_prompt_tokens,
            overlong=task.overlong,
        )
        if log is not None:
            log(report.line(max_prompt_tokens or report.longest))
    k = min(task.heldout_size, len(examples) // 2)
    rng = random.Random(task.seed)
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    heldout = [examples[i] for i in idx[:k]]
    train = [examples[i] for i in idx[k:]]
    return DataCursor(train, seed=task.seed), heldout
