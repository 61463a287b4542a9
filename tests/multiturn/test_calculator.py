"""The calc tool's safe arithmetic: values worked by hand, and what it refuses."""

import pytest

from rpeg.runtime.envs.calculator import CalcError, calc
from rpeg.runtime.envs.tools import ToolCall, parse_tool_call


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("12*7", "84"),
        ("(2+3)*4-1", "19"),
        (" 7 / 2 ", "3.5"),
        ("1/3", "0.333333"),
        ("-5+2", "-3"),
        ("2**8", "256"),
        ("0.5*4", "2"),
        ("100-250", "-150"),
    ],
)
def test_values(expr, want):
    assert calc(expr) == want


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("__import__('os').system('true')", "not allowed: Call"),
        ("os", "not allowed: Name"),
        ("(1).__class__", "not allowed: Attribute"),
        ("[1][0]", "not allowed"),
        ("'a'*3", "not a number"),
        ("True+1", "not a number"),
        ("2**100", "exponent"),
        ("9**9**9", "exponent"),
        ("2**-1", "exponent"),
        ("1e400", "out of range"),
        ("99999999*99999999", "out of range"),  # 9.99e15 > 1e15
        ("1/0", "division by zero"),
        ("1" * 65, "longer than 64"),
        ("+".join(["1"] * 30), "more than 48 parts"),  # 59 chars: 30 numbers, 29 BinOps, 29 Adds
        ("", "empty"),
        ("1+", "not an arithmetic expression"),
        ("1 if 1 else 2", "not allowed: IfExp"),
    ],
)
def test_refusals(expr, why):
    with pytest.raises(CalcError, match=why.replace("(", r"\(").replace("*", r"\*")):
        calc(expr)


def test_non_text_is_refused():
    with pytest.raises(CalcError, match="must be text"):
        calc(12)


def test_parse_tool_call():
    assert parse_tool_call("so <tool>calc(12*7)</tool> then") == ToolCall("calc", "12*7")
    assert parse_tool_call("<tool>calc((1+2)*3)</tool>") == ToolCall("calc", "(1+2)*3")
    assert parse_tool_call("<tool>calc(12*7)") is None  # not closed
    assert parse_tool_call("84") is None
