"""A task's data as training gets it: :func:`build_task_data` turns a
:class:`rpeg.config.TaskConfig` into (training cursor, held-out examples) from the synthetic
sources and files of :mod:`rpeg.runtime.data` or the multi-turn tool task of
:mod:`rpeg.runtime.envs.tool_task` (apart from both so neither imports the other).

The held-out (validation) examples: ``task.val_url``'s rows when it is set (verl's
``data.val_files``: any kind the training data accepts, read with the task's columns and
chat template; the training data keeps every row), else ``task.heldout_size`` prompts taken
out of the training data (:func:`heldout_count`; at most half of a file's rows)."""

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

FILE_SUFFIXES = ((".parquet", "parquet"), (".jsonl", "jsonl"), (".json", "jsonl"))


def val_kind(task: Any) -> str:
    """The data kind of ``task.val_url``: by its suffix (.parquet, .jsonl/.json), else the
    training data's file kind, else a ``datasets`` folder (``hf``)."""
    url = str(task.val_url)
    base = url.rsplit("#", 1)[0] if "#" in url else url
    for suffix, kind in FILE_SUFFIXES:
        if base.endswith(suffix):
            return kind
    if "#" in url or task.kind not in ("jsonl", "parquet"):
        return "hf"
    return task.kind


def heldout_count(task: Any, rows: int) -> int:
    """Prompts held out of ``rows`` training rows: none with ``task.val_url``, else
    ``task.heldout_size`` (at most half)."""
    if getattr(task, "val_url", None):
        return 0
    return min(task.heldout_size, rows // 2)


def load_val_examples(task: Any) -> list[Example]:
    """``task.val_url``'s examples (ConfigError naming ``task.val_url``)."""
    return load_examples(task.val_url, val_kind(task), RowKeys.from_task(task), "task.val_url")


def split_line(task: Any, train: int, held: int) -> str:
    """What the console says of the split: ``data: 296 train prompts, 64 held out from the
    training file`` / ``...; validation: 500 prompts from val.parquet``."""
    if getattr(task, "val_url", None):
        name = str(task.val_url).rstrip("/").rsplit("/", 1)[-1]
        return f"data: {train} train prompts; validation: {held} prompts from {name}"
    where = "the training file" if task.kind in ("jsonl", "parquet", "hf") else "the generator"
    return f"data: {train} train prompts, {held} held out from {where}"


def task_sources(cursor: DataCursor, heldout: list[Example]) -> list[str]:
    """The data sources of a task's examples (a synthetic task's: none)."""
    train = list(cursor.source) if cursor.finite else []
    return list(dict.fromkeys(ex.data_source for ex in [*train, *heldout] if ex.data_source))


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
    val = None
    if getattr(task, "val_url", None):
        val = load_val_examples(task)
        if fmt is not None:
            val, _ = render_examples(
                val,
                tokenizer,
                fmt,
                max_prompt_tokens=max_prompt_tokens,
                overlong=task.overlong,
                where="task.val_url",
            )
    if task.kind == "tool_arithmetic":  # the multi-turn tool task (rpeg.runtime.envs)
        cursor, heldout = tool_task_data(task)
        return cursor, heldout if val is None else val
    if task.kind in ("arithmetic", "countdown"):
        cls = ArithmeticSource if task.kind == "arithmetic" else CountdownSource
        held_src = cls(task.difficulty, task.seed, salt=99_991)
        heldout, seen = distinct_heldout(held_src, task.heldout_size if val is None else 0)
        train = cls(task.difficulty, task.seed, exclude=seen)
        if fmt is not None and (fmt.chat or task.system_prompt):
            rendered = RenderedSource(train, tokenizer, fmt)
            heldout = [rendered.render(ex) for ex in heldout]
            return DataCursor(rendered, seed=task.seed), heldout if val is None else val
        return DataCursor(train, seed=task.seed), heldout if val is None else val
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
    k = heldout_count(task, len(examples))
    rng = random.Random(task.seed)
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    heldout = [examples[i] for i in idx[:k]] if val is None else val
    train = [examples[i] for i in idx[k:]]
    return DataCursor(train, seed=task.seed), heldout
