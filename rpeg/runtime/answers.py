"""Answers in model text and reference answers, read as data: the answer part of a
response (``<answer>`` tags, ``####``, ``\\boxed``), plain numbers, and a safe rational parser
(:func:`parse_rational`: a hand-written tokenizer and recursive-descent parser over
:class:`fractions.Fraction`; no ``eval``, ``sympify`` or ``parse_expr`` of free text). Used by
the rule rewards (:mod:`rpeg.runtime.rewards`) and the data loaders."""

from __future__ import annotations

import re
from fractions import Fraction

_NUM = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


# --- answer extraction ---------------------------------------------------------------------
def extract_answer(text: str) -> str:
    """The answer part of a response: inside ``<answer>`` tags, after ``####``, else the text."""
    m = _TAG.findall(text)
    if m:
        return m[-1].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    if "\\boxed{" in text:
        return text
    return text.strip()


def to_number(s: str) -> float | None:
    s = s.replace(",", "").strip()
    if "/" in s:
        a, b = s.split("/", 1)
        try:
            return float(a) / float(b)
        except (ValueError, ZeroDivisionError):
            return None
    try:
        return float(s)
    except ValueError:
        return None


def last_number(text: str) -> float | None:
    nums = _NUM.findall(text)
    return to_number(nums[-1]) if nums else None


# --- a safe rational parser (no eval) --------------------------------------------------------
_RTOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(\*\*|[-+*/^()]|\\frac))")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
#: bounds that keep a crafted answer from costing more than microseconds
_MAX_TEXT, _MAX_EXPONENT, _MAX_DIGITS = 200, 64, 400


class _Unparsable(ValueError):
    pass


def parse_rational(text: str) -> Fraction | None:
    """The exact value of a plain number or arithmetic over numbers, or None.

    Accepts integers, decimals, ``1,234`` thousands separators, ``+ - * / ^ **`` and
    parentheses, and the LaTeX forms ``$..$``, ``\\boxed{..}``, ``\\frac{a}{b}``,
    ``\\cdot``, ``\\times``. A hand-written tokenizer and recursive-descent parser over
    :class:`fractions.Fraction`: no names, no calls, no ``eval``; exponents are integers of
    at most 64 and results of at most 400 digits, inputs at most 200 characters."""
    s = str(text).strip().strip("$").strip()
    if len(s) > _MAX_TEXT:
        return None
    s = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s)
    for a, b in (
        ("\\boxed", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\cdot", "*"),
        ("\\times", "*"),
        ("\\left", ""),
        ("\\right", ""),
    ):
        s = s.replace(a, b)
    s = s.replace("{", "(").replace("}", ")").rstrip(".").strip()
    tokens: list[str] = []
    pos = 0
    while pos < len(s):
        m = _RTOKEN.match(s, pos)
        if m is None or m.end() == pos:
            if s[pos:].strip() == "":
                break
            return None
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    if not tokens:
        return None
    try:
        val, i = _p_expr(tokens, 0, 0)
    except (_Unparsable, ZeroDivisionError):
        return None
    return val if i == len(tokens) else None


def _check(v: Fraction) -> Fraction:
    if len(str(v.numerator)) + len(str(v.denominator)) > _MAX_DIGITS:
        raise _Unparsable("too large")
    return v


def _p_expr(t: list[str], i: int, depth: int) -> tuple[Fraction, int]:
    v, i = _p_term(t, i, depth)
    while i < len(t) and t[i] in "+-":
        op = t[i]
        w, i = _p_term(t, i + 1, depth)
        v = _check(v + w if op == "+" else v - w)
    return v, i


def _p_term(t: list[str], i: int, depth: int) -> tuple[Fraction, int]:
    v, i = _p_unary(t, i, depth)
    while i < len(t) and t[i] in ("*", "/"):
        op = t[i]
        w, i = _p_unary(t, i + 1, depth)
        v = _check(v * w if op == "*" else v / w)
    return v, i


def _p_unary(t: list[str], i: int, depth: int) -> tuple[Fraction, int]:
    if depth > 50:
        raise _Unparsable("nested too deeply")
    if i < len(t) and t[i] in ("+", "-"):
        v, j = _p_unary(t, i + 1, depth + 1)
        return (-v if t[i] == "-" else v), j
    return _p_power(t, i, depth)


def _p_power(t: list[str], i: int, depth: int) -> tuple[Fraction, int]:
    v, i = _p_atom(t, i, depth)
    if i < len(t) and t[i] in ("^", "**"):
        e, i = _p_unary(t, i + 1, depth + 1)
        if e.denominator != 1 or abs(e.numerator) > _MAX_EXPONENT:
            raise _Unparsable("exponent must be an integer of at most 64")
        if v == 0 and e < 0:
            raise ZeroDivisionError
        v = _check(v ** int(e))
    return v, i


def _p_atom(t: list[str], i: int, depth: int) -> tuple[Fraction, int]:
    if i >= len(t):
        raise _Unparsable("unexpected end")
    tok = t[i]
    if tok == "(":
        v, i = _p_expr(t, i + 1, depth + 1)
        if i >= len(t) or t[i] != ")":
            raise _Unparsable("unbalanced parenthesis")
        return v, i + 1
    if tok == "\\frac":  # \frac{a}{b}: two bracketed atoms
        if i + 1 >= len(t) or t[i + 1] != "(":
            raise _Unparsable("\\frac needs {numerator}{denominator}")
        num, i = _p_atom(t, i + 1, depth + 1)
        if i >= len(t) or t[i] != "(":
            raise _Unparsable("\\frac needs {numerator}{denominator}")
        den, i = _p_atom(t, i, depth + 1)
        return _check(num / den), i
    if tok[0].isdigit() or tok[0] == ".":
        if len(tok) > _MAX_DIGITS:
            raise _Unparsable("too many digits")
        return Fraction(tok), i + 1
    raise _Unparsable(f"unexpected {tok!r}")
