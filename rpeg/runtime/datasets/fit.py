"""Before a run starts: the prompts as the model will get them, measured once.

:func:`fit_prompt_lengths` renders every prompt of a data file with the policy's tokenizer
(chat template applied), sets ``workload.max_prompt_tokens`` to the longest when the user
did not set it, and otherwise counts what ``task.overlong`` will filter or truncate (or
refuses the run for ``error``), saying so in one line; it warns when the tokenizer has a
chat template that ``task.chat_template: none`` leaves unused, and when rows have an empty
answer (every answer empty: the run would train on reward 0, silently before).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

FILE_KINDS = ("jsonl", "parquet", "hf")


def task_tokenizer(config: Any):
    """The policy's tokenizer: ``model.path``'s, or the built-in tiny model's."""
    if config.model.path:
        from rpeg.runtime.model_io import load_tokenizer

        return load_tokenizer(config.model.path)
    from rpeg.runtime.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def fit_prompt_lengths(config: Any, log: Callable[[str], None] | None = None):
    """``config`` with ``workload.max_prompt_tokens`` fitted to the data when unset (see the
    module doc); ConfigError for unreadable data or, with ``task.overlong: error``, for
    prompts over the limit."""
    from rpeg.runtime.data import check_template, load_examples
    from rpeg.runtime.datasets.files import RowKeys
    from rpeg.runtime.datasets.prompts import prompt_format, render_examples

    say = log or (lambda s: None)
    t, w = config.task, config.workload
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
    kept, report = render_examples(examples, tok, fmt, max_prompt_tokens=limit, overlong=t.overlong)
    longest = report.longest
    if val:  # the validation prompts count for the fitted limit too
        vkept, vr = render_examples(
            val, tok, fmt, max_prompt_tokens=limit, overlong=t.overlong, where="task.val_url"
        )
        longest = max(longest, vr.longest)
    held = len(vkept) if val else heldout_count(t, len(kept))
    split = split_line(t, len(kept) - (0 if val else held), held)
    if val and len(vkept) < len(val):
        split += f" ({len(val) - len(vkept)} over max_prompt_tokens={limit} left out)"
    if not user_set:
        config = config.with_overrides({"workload.max_prompt_tokens": longest})
        say(
            f"{report.line(longest, split, longest)}; workload.max_prompt_tokens = {longest} "
            "(the longest prompt; set it to filter or truncate longer ones)"
        )
    else:
        say(report.line(w.max_prompt_tokens, split, longest))
    return config
