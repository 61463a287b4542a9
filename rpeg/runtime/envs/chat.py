"""The chat template applied per turn of a multi-turn rollout, token in, token out.

With a chat template (``task.multiturn.chat_template: auto`` and a tokenizer that has one)
a sample is the conversation the template would render::

    render([system?, user(first observation)], add_generation_prompt=True)    -> prompt ids
    turn 1: the model's ids, as generated                                       (trained)
    wrapper 1: end of the assistant turn, the observation as a tool (or user)
               message, the next assistant header                           (not trained)
    turn 2: the model's ids, as generated ...

The model's ids are never rendered, decoded or re-encoded. Only a wrapper is text, and it
is found as a *difference* of two renderings of the conversation so far, in which every
model turn is a placeholder string::

    without = render(history + [assistant(P)],                add_generation_prompt=False)
    with_   = render(history + [assistant(P), obs_message(o)], add_generation_prompt=True)
    wrapper = with_[after the last P:]    (with_[:P] != without[:P]: a warning)

so whatever the template writes after an assistant's content (``<|im_end|>``, a newline),
around a tool message (Qwen2.5 puts it in a user turn inside ``<tool_response>`` tags) and
before the next assistant turn comes from the template itself, with the real history (a
template that numbers tool results still counts right). The wrapper's text is tokenized
alone (special tokens parsed). A template that hides a turn's or an observation's content,
or refuses the role, is a named error (:class:`ChatTemplateError`), raised by a probe before
the first turn; one that renders earlier turns differently once a later message follows
(Qwen3-style templates drop earlier turns' reasoning) is warned about: the wrapper after the
latest turn is still the template's, and the sample keeps the ids as generated.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.data import Example

#: the stand-in of a model turn in renderings (only searched for, never tokenized)
PLACEHOLDER = "RPEGMODELTURN7F3A"
FIELD = "task.multiturn.chat_template"
ROLE_FIELD = "task.multiturn.observation_role"
REWRITES = (
    "the tokenizer's chat template renders earlier turns differently once a later message "
    "follows (as templates that drop earlier turns' reasoning do); multi-turn samples keep "
    "the ids as generated, which is not what the template would render for the whole "
    "conversation"
)


class ChatTemplateError(ConfigError):
    """The tokenizer's chat template cannot wrap observations per turn."""


def tokenizer_template(tokenizer: Any) -> str:
    """The tokenizer's own chat template ("" = none; a dict of named ones: the default)."""
    own = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(own, dict):
        own = own.get("default", "")
    return own if isinstance(own, str) else ""


@dataclass(frozen=True)
class ChatTurns:
    """How one rollout renders its prompts and wraps its observations."""

    template: str
    observation_role: str = "tool"

    @classmethod
    def of(cls, multiturn: Any, tokenizer: Any) -> ChatTurns | None:
        """The chat turns of a ``task.multiturn`` section for ``tokenizer`` (None: plain
        text, today's layout: ``chat_template: none`` or a tokenizer without a template)."""
        choice = getattr(multiturn, "chat_template", "none")
        return cls.choose(choice, getattr(multiturn, "observation_role", "tool"), tokenizer)

    @classmethod
    def choose(cls, choice: str, observation_role: str, tokenizer: Any) -> ChatTurns | None:
        if choice == "none":
            return None
        if choice != "auto":
            raise ConfigError([Problem(FIELD, f"got {choice!r}; allowed: auto, none")])
        own = tokenizer_template(tokenizer)
        return cls(own, observation_role) if own else None

    # ------------------------------------------------------------------ rendering
    def render(self, tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
        try:
            return tokenizer.apply_chat_template(
                messages,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=generation,
            )
        except Exception as exc:  # jinja's TemplateError, a raise_exception() in it, ...
            roles = "/".join(m["role"] for m in messages)
            raise ChatTemplateError(
                [
                    Problem(
                        FIELD,
                        f"the tokenizer's chat template failed on roles {roles}: {exc}; set "
                        f"{ROLE_FIELD}: user (a template without a tool role) or "
                        f"{FIELD}: none",
                    )
                ]
            ) from None

    def prompt_messages(self, example: Example, first_observation: str) -> list[dict[str, str]]:
        """The prompt's messages: the example's system prompt and earlier messages, then the
        environment's first observation as the last user message."""
        msgs = [{"role": m.role, "content": m.content} for m in example.messages]
        if msgs and msgs[-1]["role"] == "user":
            msgs.pop()
        if example.system_prompt and not any(m["role"] == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": example.system_prompt})
        return [*msgs, {"role": "user", "content": first_observation}]

    def prompt_text(self, tokenizer: Any, messages: list[dict[str, str]]) -> str:
        return self.render(tokenizer, messages, generation=True)

    def history(self, prompt: list[dict[str, str]], observations: Sequence[str]):
        """The conversation after ``len(observations) + 1`` model turns (each a placeholder)."""
        msgs = list(prompt)
        for obs in observations:
            msgs += [self._turn(), self._obs(obs)]
        return [*msgs, self._turn()]

    def _turn(self) -> dict[str, str]:
        return {"role": "assistant", "content": PLACEHOLDER}

    def _obs(self, text: str) -> dict[str, str]:
        return {"role": self.observation_role, "content": text}

    def wrapper_text(
        self,
        tokenizer: Any,
        prompt: list[dict[str, str]],
        earlier: Sequence[str],
        observation: str,
    ) -> str:
        """The text between the model's latest turn and its next one: the template's end of
        the assistant turn, ``observation`` as a message, the next assistant header."""
        hist = self.history(prompt, earlier)
        without = self.render(tokenizer, hist, generation=False)
        with_ = self.render(tokenizer, [*hist, self._obs(observation)], generation=True)
        i, j = without.rfind(PLACEHOLDER), with_.rfind(PLACEHOLDER)
        why = ""
        if i < 0 or j < 0:
            why = "does not show an assistant message's content verbatim"
        elif observation and observation not in with_[j:]:
            why = f"does not show a {self.observation_role} message's content verbatim"
        elif with_[:j] != without[:i]:
            warnings.warn(REWRITES, stacklevel=2)
        if why:
            raise ChatTemplateError(
                [
                    Problem(
                        FIELD,
                        f"the tokenizer's chat template {why}: observations cannot be wrapped "
                        f"per turn; set {FIELD}: none (plain text) or {ROLE_FIELD}: "
                        f"{'user' if self.observation_role == 'tool' else 'tool'}",
                    )
                ]
            )
        return with_[j + len(PLACEHOLDER) :]

    def wrapper_ids(
        self, tokenizer: Any, prompt: list[dict[str, str]], earlier: Sequence[str], obs: str
    ) -> list[int]:
        """The wrapper's token ids (its text tokenized alone, special tokens parsed)."""
        text = self.wrapper_text(tokenizer, prompt, earlier, obs)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def probe(self, tokenizer: Any) -> None:
        """Render a two-turn conversation once: a template that cannot wrap observations is
        a named error before the first turn, not in the middle of a step."""
        prompt = self.prompt_messages(Example("probe", ""), "probe")
        self.prompt_text(tokenizer, prompt)
        self.wrapper_text(tokenizer, prompt, [], "observation")
        self.wrapper_text(tokenizer, prompt, ["observation"], "observation 2")
