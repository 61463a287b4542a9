"""Rule rewards: plain Python callables ``(prompt, response, reference_answer) -> float``.

Built in: ``exact_numeric``, ``math_equivalence`` (math-verify, sympy fallback), ``format``
(``<answer>...</answer>`` tags), ``countdown`` (expression over the given numbers hits the
target). A registry maps names (``TaskConfig.rewards``) to callables. A reward that raises
gives that sample 0 and is counted in the metrics; it never kills the step.
"""

from __future__ import annotations

import ast
import inspect
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rpeg.errors import ConfigError, Problem

RewardFn = Callable[[str, str, str], float]

_REGISTRY: dict[str, RewardFn] = {}
#: rewards whose value 1.0 means "the answer is correct" (used for the accuracy metric)
CORRECTNESS_REWARDS = ("exact_numeric", "math_equivalence", "countdown")

_NUM = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def _check_signature(name: str, fn: Callable) -> None:
    if not callable(fn):
        raise ConfigError([Problem(f"reward {name!r}", "is not callable")])
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
    if len(positional) < 3 or len(required) > 3 or any(p.kind is p.KEYWORD_ONLY for p in required):
        raise ConfigError(
            [
                Problem(
                    f"reward {name!r}",
                    f"wrong signature {sig}; a reward must be callable as "
                    "fn(prompt: str, response: str, reference_answer: str) -> float",
                )
            ]
        )


def register_reward(name: str, fn: RewardFn | None = None, *, overwrite: bool = False):
    """Register ``fn`` under ``name`` (usable as a decorator). Checks the signature now."""

    def deco(f: RewardFn) -> RewardFn:
        _check_signature(name, f)
        if name in _REGISTRY and not overwrite and _REGISTRY[name] is not f:
            raise ConfigError(
                [Problem(f"reward {name!r}", "already registered (pass overwrite=True)")]
            )
        _REGISTRY[name] = f
        return f

    return deco(fn) if fn is not None else deco


def get_reward(name: str) -> RewardFn:
    if name not in _REGISTRY:
        raise ConfigError(
            [Problem("task.rewards", f"unknown reward {name!r}; registered: {sorted(_REGISTRY)}")]
        )
    return _REGISTRY[name]


def registered_rewards() -> list[str]:
    return sorted(_REGISTRY)


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


def _to_number(s: str) -> float | None:
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
    return _to_number(nums[-1]) if nums else None


# --- built-in rewards ----------------------------------------------------------------------
@register_reward("exact_numeric")
def exact_numeric(prompt: str, response: str, reference_answer: str) -> float:
    """1.0 if the response's answer (tags / ``####`` / whole text) is the reference number."""
    ans = extract_answer(response)
    got = _to_number(ans)
    if got is None:
        return 0.0
    ref = _to_number(extract_answer(str(reference_answer)))
    if ref is None:
        ref = last_number(str(reference_answer))
    if ref is None:
        return 0.0
    return 1.0 if math.isclose(got, ref, rel_tol=1e-9, abs_tol=1e-6) else 0.0


@register_reward("math_equivalence")
def math_equivalence(prompt: str, response: str, reference_answer: str) -> float:
    """1.0 if the answer is mathematically equal to the reference (math-verify, else sympy)."""
    ans = extract_answer(response)
    try:
        from math_verify import parse, verify

        gold = parse(str(reference_answer))
        pred = parse(ans if ans.startswith("$") or "\\boxed" in ans else f"${ans}$")
        if gold and pred:
            return 1.0 if verify(gold, pred) else 0.0
    except ImportError:  # pragma: no cover - math-verify is a dependency
        pass
    import sympy

    try:
        diff = sympy.simplify(sympy.sympify(ans) - sympy.sympify(str(reference_answer)))
        return 1.0 if diff == 0 else 0.0
    except (sympy.SympifyError, TypeError, SyntaxError):
        return 0.0


@register_reward("format")
def format_reward(prompt: str, response: str, reference_answer: str) -> float:
    """1.0 if the response is ``[<think>...</think>] <answer>...</answer>`` (whitespace allowed)."""
    pat = r"\s*(<think>.*?</think>\s*)?<answer>.*?</answer>\s*"
    return 1.0 if re.fullmatch(pat, response, re.S) else 0.0


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval_expr(node: ast.AST, used: list[int]) -> float:
    if isinstance(node, ast.Expression):
        return _eval_expr(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_expr(node.left, used), _eval_expr(node.right, used))
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        used.append(node.value)
        return float(node.value)
    raise ValueError("only + - * / over integers")


@register_reward("countdown")
def countdown(prompt: str, response: str, reference_answer: str) -> float:
    """Reference ``"target|n1,n2,..."``: 1.0 if the expression uses each given number at most
    once and evaluates to the target."""
    target_s, nums_s = str(reference_answer).split("|", 1)
    target = float(target_s)
    avail = [int(x) for x in nums_s.split(",") if x]
    expr = extract_answer(response).split("=")[0].strip()
    used: list[int] = []
    try:
        val = _eval_expr(ast.parse(expr, mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return 0.0
    for u in used:
        if u in avail:
            avail.remove(u)
        else:
            return 0.0
    return 1.0 if math.isclose(val, target, abs_tol=1e-6) else 0.0


# --- applying a set of rewards -------------------------------------------------------------
@dataclass
class RewardResult:
    rewards: list[float]  # total reward per sample (sum over the listed rewards)
    correct: list[float]  # 1.0 / 0.0 per sample from the first correctness reward (accuracy)
    errors: int = 0  # reward calls that raised (each gave 0)
    per_reward: dict[str, list[float]] = field(default_factory=dict)
    error_messages: list[str] = field(default_factory=list)


class RewardSet:
    """Several named rewards; a sample's reward is their sum."""

    def __init__(self, names: Sequence[str] | Sequence[tuple[str, RewardFn]]):
        self.fns: list[tuple[str, RewardFn]] = []
        for item in names:
            if isinstance(item, tuple):
                name, fn = item
                _check_signature(name, fn)
            else:
                name, fn = item, get_reward(item)
            self.fns.append((name, fn))
        if not self.fns:
            raise ConfigError([Problem("task.rewards", "at least one reward is needed")])
        corr = [n for n, _ in self.fns if n in CORRECTNESS_REWARDS]
        self.correctness = corr[0] if corr else self.fns[0][0]

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], refs: Sequence[str]
    ) -> RewardResult:
        per: dict[str, list[float]] = {}
        errors = 0
        msgs: list[str] = []
        for name, fn in self.fns:
            vals = []
            for p, r, a in zip(prompts, responses, refs, strict=True):
                try:
                    v = float(fn(p, r, a))
                    if not math.isfinite(v):
                        raise ValueError(f"non-finite reward {v}")
                except Exception as exc:  # a broken reward must never kill the step
                    errors += 1
                    if len(msgs) < 5:
                        msgs.append(f"{name}: {type(exc).__name__}: {exc}")
                    v = 0.0
                vals.append(v)
            per[name] = vals
        total = [sum(vs) for vs in zip(*per.values(), strict=True)]
        correct = [1.0 if v >= 1.0 else 0.0 for v in per[self.correctness]]
        return RewardResult(total, correct, errors, per, msgs)
