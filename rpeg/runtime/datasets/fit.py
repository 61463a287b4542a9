"""Before a run starts: the prompts as the model will get them, measured once.

:func:`fit_prompt_lengths` renders every prompt of a data file with the policy's tokenizer
(chat template applied), sets ``workload.max_prompt_tokens`` to the longest when the user
did not set it, and otherwise counts what ``task.overlong`` will filter or truncate (or
refuses the run for ``error``), saying so in one line; it warns when the tokenizer has a
chat template that ``task.chat_template: none`` leaves unused, and when rows have an empty
answer (every answer empty: the run would train on reward 0, silently before).

Every prompt length is capped by the model's context (:func:`model_context`) less
``workload.max_response_tokens`` before anything is allocated: a fitted limit never exceeds
it, and longer prompts are filtered, truncated or refused as ``task.overlong`` says (issue 44:
3 prompts of 100k characters made the limit 100,013 tokens for a 256-token model and the
warm-up grew to 23.8 GB). A response cap that leaves no room for a prompt is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from rpeg.errors import ConfigError, Problem

FILE_KINDS = ("jsonl", "parquet", "hf")


def task_tokenizer(config: Any):
    """The policy's tokenizer: ``model.path``'s, or the built-in tiny model's."""
    if config.model.path:
        from rpeg.runtime.model_io import load_tokenizer

        return load_tokenizer(config.model.path)
    from rpeg.runtime.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def model_context(config: Any) -> int | None:
    """The policy's context in tokens (``max_position_embeddings``): ``model.path``'s
    ``config.json`` (its ``text_config`` for a multimodal folder), or the built-in tiny
    model's shape; None when the folder does not say."""
    if config.model.path:
        import json

        import fsspec

        try:
            with fsspec.open(f"{config.model.path.rstrip('/')}/config.json", "r") as fh:
                cfg = json.load(fh)
        except (OSError, ValueError):
            return None  # the preflight names an unreadable model folder
        if not isinstance(cfg, dict):
            return None
        if "max_position_embeddings" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]
        v = cfg.get("max_position_embeddings")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    from rpeg.runtime.model_io.loading import TINY_SHAPE

    return int({**TINY_SHAPE, **(config.model.tiny_shape or {})}["max_position_embeddings"])


def context_problems(config: Any) -> list[Problem]:
    """A response cap that leaves no room for a prompt in the model's context."""
    ctx, r = model_context(config), config.workload.max_response_tokens
    if ctx is not None and r >= ctx:
        return [
            Problem(
                "workload.max_response_tokens",
                f"{r} tokens leave no room for a prompt in the model's context of {ctx} tokens "
                f"(max_position_embeddings); at most {ctx - 1}",
            )
        ]
    return []


def fit_prompt_lengths(config: Any, log: Callable[[str], None] | None = None):
    """``config`` with ``workload.max_prompt_tokens`` fitted to the data when unset (see the
    module doc); ConfigError for unreadable data or, with ``task.overlong: error``, for
    prompts over the limit."""
    from rpeg.runtime.data import check_template, load_examples
    from rpeg.runtime.datasets.files import RowKeys
    from rpeg.runtime.datasets.prompts import prompt_format, render_examples

    say = log or (lambda s: None)
    t, w = config.task, config.workload
    if context_problems(config):
        raise ConfigError(context_problems(config))
    if check_template(t.prompt_template):
        return config  # the preflight names the template's problem
    if t.kind not in FILE_KINDS and not config.model.path:
        return config  # the built-in tokenizer has no chat template; synthetic prompts fit
    tok = task_tokenizer(config)
    fmt = prompt_format(t, tok)
    if fmt.unused:
        say(
            "warning: the model's tokenizer has a chat template and task.chat_template is "
            "none: prompts go to the model as plain text"
        )
    from rpeg.runtime.task_data import heldout_count, load_val_examples, split_line

    val = load_val_examples(t) if t.val_url else []
    if t.kind not in FILE_KINDS:
        if fmt.chat:
            say(f"prompts: {fmt.describe()}")
        if val:
            _, vr = render_examples(
                val, tok, fmt, max_prompt_tokens=None, overlong=t.overlong, where="task.val_url"
            )
            say(f"validation: {len(val)} prompts from {t.val_url}, longest {vr.longest} tokens")
        return config
    examples = load_examples(t.url, t.kind, RowKeys.from_task(t))
    if t.heldout_size and len(examples) < 2 and not t.val_url:
        say(
            f"warning: {t.url} holds {len(examples)} row: nothing is held out "
            "(task.heldout_size takes at most half the rows), so no held-out accuracy"
        )
    empty = sum(1 for e in examples if not str(e.answer).strip())
    if empty:  # every reward that compares to the answer scores 0 there (a silent 0 before)
        warn = say if log is not None else (lambda m: print(m, file=sys.stderr))
        key = t.answer_key or "answer"
        warn(
            f"warning: {empty} of {len(examples)} rows of {t.url} have an empty answer "
            f"({key!r}); rewards that compare to it score 0 on those rows"
            + (": the run would train on nothing" if empty == len(examples) else "")
        )
    user_set = "max_prompt_tokens" in w.model_fields_set
    limit = w.max_prompt_tokens if user_set else None
    ctx = model_context(config)
    budget = None if ctx is None else ctx - w.max_response_tokens  # > 0: context_problems
    what = "workload.max_prompt_tokens"
    if budget is not None and (limit is None or budget < limit):
        limit = budget  # a limit from the data (or the user's) never runs past the context
        what = (
            f"the model's context ({ctx} tokens) less workload.max_response_tokens "
            f"({w.max_response_tokens})"
        )
    kept, report = render_examples(
        examples, tok, fmt, max_prompt_tokens=limit, overlong=t.overlong, limit_what=what
    )
    longest = report.longest
    if val:  # the validation prompts count for the fitted limit too
        vkept, vr = render_examples(
            val,
            tok,
            fmt,
            max_prompt_tokens=limit,
            overlong=t.overlong,
            where="task.val_url",
            limit_what=what,
        )
        longest = max(longest, vr.longest)
    held = len(vkept) if val else heldout_count(t, len(kept))
    split = split_line(t, len(kept) - (0 if val else held), held)
    if val and len(vkept) < len(val):
        split += f" ({len(val) - len(vkept)} over max_prompt_tokens={limit} left out)"
    if not user_set:
        config = config.with_overrides({"workload.max_prompt_tokens": longest})
        say(
            f"{report.line(limit or longest, split, longest)}; workload.max_prompt_tokens = "
            f"{longest} (the longest prompt; set it to filter or truncate longer ones)"
            + (f"; prompts capped by {what}" if limit is not None else "")
        )
    else:
        say(report.line(limit, split, longest))
    return config
