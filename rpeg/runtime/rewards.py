"""Rule rewards: plain Python callables ``(prompt, response, reference_answer) -> float``.

Built in: ``exact_numeric``, ``math_equivalence`` (math-verify, then a safe rational parser),
``format`` (``<answer>...</answer>`` tags), ``countdown`` (expression over the given numbers
hits the target). A registry maps names (``TaskConfig.rewards``) to callables. A reward that
raises gives that sample 0 and is counted in the metrics; more than
``task.max_reward_error_share`` of failing calls in one batch fails the step loudly
(:class:`RewardErrorShare`).

Model output and reference answers are data: nothing here evaluates them as code (no
``eval``, ``sympify`` or ``parse_expr`` of free text; :mod:`rpeg.runtime.answers` reads them).

Where a reward runs (:class:`RewardSet`, ``isolation="auto"``): rewards registered with
``bounded=True`` (the built-ins: they finish in bounded time on any input) run in the calling
thread, except those that also need the main thread (math-verify's time limits use
``signal.alarm``, which only works on a process's main thread; Dask runs actor methods on
threads) when called from another thread. Every other registered reward (user code from
``task.reward_modules``, which may hang) runs in the verifier pool (:mod:`rpeg.runtime.verifier`:
reused child processes, ``task.reward_timeout_s`` per sample, slow samples scored concurrently)
in both runtimes, ``--local`` included. A reward passed as a ``(name, fn)`` pair, defined in ``__main__``
or registered at run time (importing its module does not register it) cannot be built by a
child: it runs in the calling thread, without a limit.
"""

from __future__ import annotations

import ast
import inspect
import math
import operator
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import ConfigError, Problem, RpegError
from rpeg.runtime.answers import extract_answer, last_number, parse_rational, to_number
from rpeg.runtime.verifier import NOT_REGISTERED, call_reward, verifier_pool

RewardFn = Callable[[str, str, str], float]

_REGISTRY: dict[str, RewardFn] = {}
#: rewards that must run on a main thread (math-verify's signal.alarm time limits)
_MAIN_THREAD: set[str] = set()
#: rewards known to finish in bounded time on any input (run without the pool's time limit)
_BOUNDED: set[str] = set()
#: rewards whose value 1.0 means "the answer is correct" (used for the accuracy metric)
CORRECTNESS_REWARDS = ("exact_numeric", "math_equivalence", "countdown")


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


def register_reward(
    name: str,
    fn: RewardFn | None = None,
    *,
    overwrite: bool = False,
    needs_main_thread: bool = False,
    bounded: bool = False,
):
    """Register ``fn`` under ``name`` (usable as a decorator). Checks the signature now.

    ``bounded``: the reward finishes in bounded time on any input, so it runs in the calling
    thread; otherwise (the default: user code may hang) it runs in the verifier pool under
    ``task.reward_timeout_s``, its module imported by the pool's children.
    ``needs_main_thread``: the reward uses signals; off the main thread it runs in the pool."""

    def deco(f: RewardFn) -> RewardFn:
        _check_signature(name, f)
        if name in _REGISTRY and not overwrite and _REGISTRY[name] is not f:
            raise ConfigError(
                [Problem(f"reward {name!r}", "already registered (pass overwrite=True)")]
            )
        _REGISTRY[name] = f
        for flag, names in ((needs_main_thread, _MAIN_THREAD), (bounded, _BOUNDED)):
            if flag:
                names.add(name)
            else:
                names.discard(name)
        return f

    return deco(fn) if fn is not None else deco


def get_reward(name: str) -> RewardFn:
    if name not in _REGISTRY:
        raise ConfigError(
            [Problem("task.rewards", f"unknown reward {name!r}; registered: {sorted(_REGISTRY)}")]
        )
    return _REGISTRY[name]


def load_reward_modules(names: list[str]) -> list[Problem]:
    """Import each module of ``task.reward_modules`` (an importable name: installed in the
    workers' environment or on their PYTHONPATH, as the workers see it); a module that
    registers its rewards with :func:`register_reward` at import. Problems name the module
    and the import error. Imported once per process (Python's module cache)."""
    import importlib

    out = []
    for i, name in enumerate(names):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
            out.append(
                Problem(
                    f"task.reward_modules[{i}]",
                    f"cannot import {name!r} ({type(exc).__name__}: {exc}); it must be "
                    "importable in the driver and on every worker (installed, or on PYTHONPATH)",
                )
            )
    return out


def registered_rewards() -> list[str]:
    return sorted(_REGISTRY)


# --- built-in rewards ----------------------------------------------------------------------
@register_reward("exact_numeric", bounded=True)
def exact_numeric(prompt: str, response: str, reference_answer: str) -> float:
    """1.0 if the response's answer (tags / ``####`` / whole text) is the reference number."""
    ans = extract_answer(response)
    got = to_number(ans)
    if got is None:
        return 0.0
    ref = to_number(extract_answer(str(reference_answer)))
    if ref is None:
        ref = last_number(str(reference_answer))
    if ref is None:
        return 0.0
    return 1.0 if math.isclose(got, ref, rel_tol=1e-9, abs_tol=1e-6) else 0.0


@register_reward("math_equivalence", needs_main_thread=True, bounded=True)
def math_equivalence(prompt: str, response: str, reference_answer: str) -> float:
    """1.0 if the answer is mathematically equal to the reference.

    math-verify decides when it parses both sides (its LaTeX grammar is an ANTLR parser;
    its plain-expression path only admits digits and ``+-*/^()``); otherwise the safe
    rational parser (:func:`parse_rational`) compares plain numbers. Nothing here evaluates
    model text as code. math-verify's own time limits use ``signal.alarm``, so this reward
    must run on a main thread: :class:`RewardSet` sends it to a process pool elsewhere."""
    ans = extract_answer(response)
    ref = str(reference_answer)
    try:
        from math_verify import parse, verify

        gold = parse(ref)
        pred = parse(ans if ans.startswith("$") or "\\boxed" in ans else f"${ans}$")
        if gold and pred:
            return 1.0 if verify(gold, pred) else 0.0
    except ImportError:  # pragma: no cover - math-verify is a dependency
        pass
    got, want = parse_rational(ans), parse_rational(extract_answer(ref))
    if got is None or want is None:
        return 0.0
    return 1.0 if got == want else 0.0


@register_reward("format", bounded=True)
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


@register_reward("countdown", bounded=True)
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


def needs_main_thread(name: str) -> bool:
    return name in _MAIN_THREAD


# --- applying a set of rewards -------------------------------------------------------------
class RewardErrorShare(RpegError):
    """More of a batch's reward calls raised than ``task.max_reward_error_share`` allows."""


@dataclass
class RewardResult:
    rewards: list[float]  # total reward per sample (sum over the listed rewards)
    correct: list[float]  # 1.0 / 0.0 per sample from the first correctness reward (accuracy)
    errors: int = 0  # reward calls that raised (each gave 0)
    per_reward: dict[str, list[float]] = field(default_factory=dict)
    error_messages: list[str] = field(default_factory=list)


class RewardSet:
    """Several named rewards; a sample's reward is their sum.

    ``max_error_share``: fail (:class:`RewardErrorShare`) when more than this share of one
    batch's reward calls raise (None = never). ``isolation``: ``"auto"`` (module doc),
    ``"process"`` runs every reward a child can import in the verifier pool, ``"inline"``
    none. ``timeout_s``: wall-clock limit per sample in the pool. ``modules``: the task's
    ``reward_modules`` (the pool's children import them)."""

    def __init__(
        self,
        names: Sequence[str] | Sequence[tuple[str, RewardFn]],
        *,
        max_error_share: float | None = None,
        isolation: str = "auto",
        timeout_s: float = 30.0,
        modules: Sequence[str] = (),
    ):
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
        if isolation not in ("auto", "process", "inline"):
            raise ConfigError(
                [Problem("isolation", f"got {isolation!r}; allowed: auto, process, inline")]
            )
        corr = [n for n, _ in self.fns if n in CORRECTNESS_REWARDS]
        self.correctness = corr[0] if corr else self.fns[0][0]
        self.max_error_share = max_error_share
        self.isolation = isolation
        self.timeout_s = timeout_s
        self.modules = list(modules)
        self._inline: set[str] = set()  # the pool's children could not build these

    @classmethod
    def from_task(cls, task: Any) -> RewardSet:
        """The rewards of a :class:`rpeg.config.TaskConfig` with its error-share limit; its
        ``reward_modules`` are imported first (in every process that builds one: the local
        trainer, every rank's actor), so that their ``register_reward`` calls have run."""
        modules = getattr(task, "reward_modules", None) or []
        problems = load_reward_modules(modules)
        if problems:
            raise ConfigError(problems)
        return cls(
            task.rewards,
            max_error_share=task.max_reward_error_share,
            timeout_s=task.reward_timeout_s,
            modules=modules,
        )

    @property
    def names(self) -> list[str]:
        """The rules in the order of :attr:`RewardResult.per_reward` (a batch's
        ``reward_parts`` columns)."""
        return list(dict.fromkeys(n for n, _ in self.fns))

    def _isolate(self, name: str, fn: RewardFn) -> bool:
        """Whether ``name`` runs in the verifier pool (module doc)."""
        importable = _REGISTRY.get(name) is fn and getattr(fn, "__module__", "") != "__main__"
        if self.isolation == "inline" or not importable or name in self._inline:
            return False
        if self.isolation == "process" or name not in _BOUNDED:
            return True
        on_main = threading.current_thread() is threading.main_thread()
        return needs_main_thread(name) and not on_main

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], refs: Sequence[str]
    ) -> RewardResult:
        per: dict[str, list[float]] = {}
        errors = 0
        msgs: list[str] = []
        items = list(zip(prompts, responses, refs, strict=True))
        for name, fn in self.fns:
            if self._isolate(name, fn):
                outcomes = verifier_pool().map(name, fn, items, self.timeout_s, self.modules)
                if (
                    not needs_main_thread(name)
                    and outcomes
                    and all(NOT_REGISTERED in err for _, err in outcomes)
                ):  # registered at run time, not by importing its module: inline from now
                    self._inline.add(name)
                    outcomes = [call_reward(fn, *it) for it in items]
            else:
                outcomes = [call_reward(fn, *it) for it in items]
            vals = []
            for v, err in outcomes:
                if v is not None and not math.isfinite(v):
                    v, err = None, f"ValueError: non-finite reward {v}"
                if v is None:  # a broken reward must never kill the step on its own
                    errors += 1
                    if len(msgs) < 5:
                        msgs.append(f"{name}: {err}")
                    v = 0.0
                vals.append(v)
            per[name] = vals
        calls = len(items) * len(self.fns)
        if self.max_error_share is not None and calls and errors / calls > self.max_error_share:
            raise RewardErrorShare(
                f"{errors} of {calls} reward calls raised ({errors / calls:.0%} > "
                f"task.max_reward_error_share={self.max_error_share:g}); first: "
                + "; ".join(msgs[:3])
            )
        total = [sum(vs) for vs in zip(*per.values(), strict=True)]
        correct = [1.0 if v >= 1.0 else 0.0 for v in per[self.correctness]]
        return RewardResult(total, correct, errors, per, msgs)
