"""A safe arithmetic evaluator for the ``calc`` tool: an AST walk, never ``eval``.

Allowed: integer and decimal literals, ``+ - * /``, unary ``+ -``, parentheses, and ``**``
with a small integer exponent. Everything else (names, calls, attributes, subscripts,
strings, comparisons, ``__import__``...) is refused with :class:`CalcError`. Limits keep
every call cheap: the text's length, the number of AST nodes, the size of every literal and
intermediate value, the exponent, and the bits of every exact value (numerator plus
denominator), checked *before* each operation from its operands' bits: ``(1/7)**8`` nested
eight deep has a small value but a denominator of 7**(8**8), which Python would spend minutes
computing with the GIL held (issue 44). The tool also runs in a child process that is killed
at the environment's timeout (:mod:`rpeg.runtime.envs.tool_sandbox`). Arithmetic is exact (:class:`fractions.Fraction`); the
result is written as an integer when whole, else as a decimal rounded to 6 places.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

#: the longest expression text accepted (characters)
MAX_CHARS = 64
#: the most AST nodes an expression may have
MAX_NODES = 48
#: the largest absolute value of any literal, intermediate or result
MAX_ABS = 10**15
#: the largest exponent ``**`` accepts (0 .. MAX_EXPONENT, integers only)
MAX_EXPONENT = 8
#: the most bits an exact value (numerator + denominator) may hold, and the most an operation
#: may be about to produce: a 4,096-bit product takes microseconds
MAX_BITS = 4096

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """The expression is not allowed or cannot be computed; the message says why."""


def _bounded(v: Fraction) -> Fraction:
    if abs(v) > MAX_ABS:
        raise CalcError(f"value out of range (|x| > {MAX_ABS})")
    return v


def _bits(v: Fraction) -> int:
    return v.numerator.bit_length() + v.denominator.bit_length()


def _room(bits: int) -> None:
    """Refuse an operation whose result may need more than :data:`MAX_BITS` (checked before
    computing it: the bits of a sum, product or quotient are at most the operands' sum plus
    one; of a power, the base's times the exponent)."""
    if bits > MAX_BITS:
        raise CalcError(f"result too precise (over {MAX_BITS} bits of numerator and denominator)")


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise CalcError(f"not a number: {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise CalcError("value out of range")
        return _bounded(Fraction(v))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) is ast.Pow:
        base, exp = _walk(node.left), _walk(node.right)
        if exp.denominator != 1 or not 0 <= exp <= MAX_EXPONENT:
            raise CalcError(f"exponent must be an integer in 0..{MAX_EXPONENT}")
        if base == 0 and exp == 0:
            raise CalcError("0**0 is undefined")
        _room(_bits(base) * int(exp))
        return _bounded(base ** int(exp))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalcError("division by zero")
        _room(_bits(left) + _bits(right) + 1)
        return _bounded(_BINARY[type(node.op)](left, right))
    raise CalcError(f"not allowed: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; :class:`CalcError` when it is refused."""
    if not isinstance(expression, str):
        raise CalcError("the expression must be text")
    text = expression.strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalcError(f"not an arithmetic expression ({exc.__class__.__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError(f"expression has more than {MAX_NODES} parts")
    return _walk(tree)


def format_number(v: Fraction) -> str:
    """``12`` for whole values, else a decimal rounded to 6 places (``0.333333``, ``-2.5``)."""
    if v.denominator == 1:
        return str(v.numerator)
    s = f"{float(v):.6f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def calc(expression: str) -> str:
    """The ``calc`` tool: the value of ``expression`` as text (raises :class:`CalcError`)."""
    return format_number(evaluate(expression))
