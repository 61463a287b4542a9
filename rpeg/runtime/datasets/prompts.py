"""The exact prompt text a model gets, its length in tokens, and overlong prompts.

``task.chat_template``: ``auto`` applies the tokenizer's chat template (``tokenizer.
chat_template``, rendered by transformers' sandboxed Jinja environment, with
``add_generation_prompt=True``) when it has one; ``none`` gives the prompt text as is; any
other value is the path of a Jinja template file used instead of the tokenizer's. Text
prompts (a ``question`` column, the synthetic tasks) pass through ``task.prompt_template``
first and become one user message; chat data (verl's and TRL's ``prompt`` messages) are
used as they are. ``task.system_prompt`` goes in front of prompts that have no system
message. Without a template, messages are joined by blank lines.

Rewards never see template tokens: responses are decoded with ``skip_special_tokens``
(``<|im_end|>`` and the like are special tokens of their tokenizers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rpeg.errors import ConfigError, Problem


@dataclass(frozen=True)
class PromptFormat:
    """How examples become prompt text: the Jinja chat template in use ("" = none) and where
    it came from (``tokenizer`` / a path / ``none``); ``unused`` names a template the
    tokenizer has that ``task.chat_template: none`` leaves unused."""

    template: str
    source: str
    prompt_template: str = "{question}"
    unused: bool = False

    @property
    def chat(self) -> bool:
        return bool(self.template)

    def describe(self) -> str:
        if self.chat:
            return f"chat template applied ({self.source})"
        return "no chat template" + (
            " (the tokenizer has one; task.chat_template: none leaves it unused)"
            if self.unused
            else ""
        )


def prompt_format(task: Any, tokenizer: Any) -> PromptFormat:
    """The :class:`PromptFormat` of ``task`` for ``tokenizer``."""
    own = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(own, str):  # a dict of named templates: the default one
        own = own.get("default", "") if isinstance(own, dict) else ""
    choice = getattr(task, "chat_template", "auto") or "auto"
    tpl = getattr(task, "prompt_template", "{question}")
    if choice == "none":
        return PromptFormat("", "none", tpl, unused=bool(own))
    if choice == "auto":
        return PromptFormat(own, "the tokenizer's" if own else "none", tpl)
    import fsspec

    try:
        with fsspec.open(choice, "r") as fh:
            text = fh.read()
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(
            [
                Problem(
                    "task.chat_template",
                    f"{choice!r} is not a file; allowed: auto, none, or a Jinja template file",
                )
            ]
        ) from None
    return PromptFormat(text, choice, tpl)


def messages_of(example: Any, fmt: PromptFormat) -> list[dict[str, str]]:
    """The chat messages of ``example`` (a text prompt becomes one user message)."""
    if example.messages:
        msgs = [{"role": m.role, "content": m.content} for m in example.messages]
    else:
        msgs = [{"role": "user", "content": fmt.prompt_template.format(question=example.question)}]
    if example.system_prompt and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": example.system_prompt})
    return msgs


def render(example: Any, tokenizer: Any, fmt: PromptFormat) -> str:
    """The prompt text of ``example`` under ``fmt``."""
    if fmt.chat:
        return tokenizer.apply_chat_template(
            messages_of(example, fmt),
            chat_template=fmt.template,
            tokenize=False,
            add_generation_prompt=True,
        )
    if not example.messages and not example.system_prompt:
        return fmt.prompt_template.format(question=example.question)
    return "\n\n".join(m["content"] for m in messages_of(example, fmt))


def prompt_tokens(tokenizer: Any, text: str, chat: bool = False) -> list[int]:
    """Token ids of a prompt as the policy encodes it (``PolicyWorker.encode_prompts``: the
    tokenizer's special tokens, BOS in front when it has one)."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    return ids if bos is None or ids[:1] == [bos] else [bos, *ids]


@dataclass(frozen=True)
class PromptReport:
    """What :func:`render_examples` did: prompts kept, filtered, truncated; the longest."""

    total: int
    filtered: int
    truncated: int
    longest: int
    fmt: PromptFormat

    def line(self, limit: int, head: str = "", longest: int | None = None) -> str:
        """``head``: what the data is split into (default ``data: N prompts``);
        ``longest``: the longest prompt counted (default: this report's)."""
        head = head or f"data: {self.total - self.filtered} prompts"
        what = f"{head}, longest {self.longest if longest is None else longest} tokens"
        if self.filtered:
            what += f"; {self.filtered} longer than max_prompt_tokens={limit} filtered out"
        if self.truncated:
            what += f"; {self.truncated} truncated to their last {limit} tokens"
        return f"{what}; {self.fmt.describe()}"


def _truncate(tokenizer: Any, ids: list[int], limit: int, chat: bool) -> str:
    """The text of the last ``limit`` tokens (re-encoding may differ by a token: trimmed
    until it fits)."""
    keep = limit
    while keep > 0:
        text = tokenizer.decode(ids[-keep:], skip_special_tokens=False)
        if len(prompt_tokens(tokenizer, text, chat)) <= limit:
            return text
        keep -= 1
    return ""


def render_examples(
    examples: Sequence[Any],
    tokenizer: Any,
    fmt: PromptFormat,
    *,
    max_prompt_tokens: int | None,
    overlong: str = "filter",
    where: str = "task.url",
    limit_what: str = "workload.max_prompt_tokens",
) -> tuple[list[Any], PromptReport]:
    """Every example with its prompt text rendered (``Example.rendered``) and overlong ones
    handled per ``overlong``; ``max_prompt_tokens`` None = no limit; ``limit_what``: where
    the limit comes from, for the errors."""
    out, filtered, truncated, longest, over = [], 0, 0, 0, []
    for ex in examples:
        text = render(ex, tokenizer, fmt)
        ids = prompt_tokens(tokenizer, text, fmt.chat)
        n = len(ids)
        if max_prompt_tokens is not None and n > max_prompt_tokens:
            if overlong == "filter":
                filtered += 1
                continue
            if overlong == "truncate":
                text = _truncate(tokenizer, ids, max_prompt_tokens, fmt.chat)
                n = len(prompt_tokens(tokenizer, text, fmt.chat))
                truncated += 1
            else:
                over.append(n)
        longest = max(longest, n)
        out.append(dataclasses.replace(ex, rendered=text))
    fix = "raise it, or " if limit_what == "workload.max_prompt_tokens" else ""
    if over:
        raise ConfigError(
            [
                Problem(
                    "task.overlong" if limit_what != "workload.max_prompt_tokens" else limit_what,
                    f"{len(over)} of {len(examples)} prompts of {where} are longer than "
                    f"{max_prompt_tokens} tokens ({limit_what}; the longest {max(over)}); "
                    f"{fix}set task.overlong: filter (drop them) or truncate",
                )
            ]
        )
    if examples and not out:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"all {len(examples)} prompts are longer than {max_prompt_tokens} tokens "
                    f"({limit_what}) and were filtered out",
                )
            ]
        )
    return out, PromptReport(len(examples), filtered, truncated, longest, fmt)


class RenderedSource:
    """A synthetic (infinite, indexable) source whose examples come with their prompt text
    rendered under a chat template."""

    def __init__(self, source: Any, tokenizer: Any, fmt: PromptFormat):
        self.source, self.tokenizer, self.fmt = source, tokenizer, fmt
        self.kind = getattr(source, "kind", "")

    def __len__(self) -> int | None:
        return self.source.__len__()

    def render(self, ex: Any) -> Any:
        return dataclasses.replace(ex, rendered=render(ex, self.tokenizer, self.fmt))

    def __getitem__(self, index: int) -> Any:
        return self.render(self.source[index])
