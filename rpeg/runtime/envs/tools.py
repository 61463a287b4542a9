"""Tools a model may call from its text, and the call syntax ``<tool>name(argument)</tool>``.

A tool is a function ``str -> str``; :data:`TOOLS` maps names to tools. The names here are
the ones ``task.multiturn.tools`` accepts (rpeg.config lists the same names; a test checks
both agree). A tool may raise, hang or return something that is not text: the rollout's
:class:`rpeg.runtime.envs.runner.EnvRunner` turns each of those into an error sample with a
counted reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rpeg.runtime.envs.calculator import calc

#: the text that opens and closes a tool call in the model's output
TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
#: the observation's wrapping: ``<result>84</result>``, or ``<error>why</error>``
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ERROR_OPEN, ERROR_CLOSE = "<error>", "</error>"

_CALL = re.compile(r"<tool>\s*([A-Za-z_][A-Za-z0-9_]*)\((.*?)\)\s*</tool>", re.S)


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[str], str]
    description: str


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a model's turn: ``<tool>name(argument)</tool>``."""

    name: str
    argument: str


TOOLS: dict[str, Tool] = {
    "calc": Tool("calc", calc, "exact arithmetic over numbers, + - * / ( ) and small powers"),
}


def tool_names() -> list[str]:
    return sorted(TOOLS)


def parse_tool_call(text: str) -> ToolCall | None:
    """The first well-formed tool call in ``text`` (None when there is none)."""
    m = _CALL.search(text)
    return ToolCall(m.group(1), m.group(2)) if m else None


def has_tool_open(text: str) -> bool:
    """Whether the text starts a tool call (well-formed or not): what the tool-use rate counts."""
    return TOOL_OPEN in text
