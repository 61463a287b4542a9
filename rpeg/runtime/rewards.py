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

Rewards by data source (``task.reward_by_source``, verl's ``default_compute_score``): a row
whose ``data_source`` matches a key of the mapping (exactly, or as an ``fnmatch`` pattern such
as ``numina_*``) is scored by the mapped rule(s) *in place of* the task's correctness rules
(``exact_numeric``, ``math_equivalence``, ``countdown``); the task's other rules (``format``,
your own) still score every row, and rows of other sources get ``task.rewards`` unchanged. A
task whose rewards hold no correctness rule is routed only by the keys you wrote yourself
(the shipped defaults, :data:`rpeg.defaults.REWARD_BY_SOURCE`, never replace your own
scoring).
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import math
import operator
import re
import threading
from collections.abc import Callable, Mapping, Sequence
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


#: how long importing a ``task.reward_modules`` module may take in the preflight's child
#: process (seconds; a module importing torch takes a few on a loaded machine)
REWARD_IMPORT_TIMEOUT_S = 120.0
#: modules whose import this process tried in a child -> why it failed ("" imported)
_PROBED: dict[str, str] = {}

_PROBE = """
import importlib, json, os, sys
try:
    importlib.import_module(sys.argv[1])
    got = {"ok": True}
except SystemExit as exc:
    got = {"error": f"SystemExit: the module called sys.exit({exc.code!r}) on import"}
except BaseException as exc:
    got = {"error": f"{type(exc).__name__}: {exc}"}
sys.stdout.write("\\n" + json.dumps(got) + "\\n")
sys.stdout.flush()
os._exit(0)
"""


def probe_import(name: str, timeout_s: float) -> str:
    """Import ``name`` in a child process killed after ``timeout_s``; returns why it failed
    ("" when it imported). A hanging or ``sys.exit``-ing import stops the child, not this
    process."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, name],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"the import did not finish within {timeout_s:g} s (stopped)"
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    try:
        got = json.loads(lines[-1]) if lines else {}
    except ValueError:
        got = {}
    if got.get("ok"):
        return ""
    return got.get("error") or f"the importing process ended with exit code {done.returncode}"


def load_reward_modules(names: list[str], timeout_s: float | None = None) -> list[Problem]:
    """Import each module of ``task.reward_modules`` (an importable name: installed in the
    workers' environment or on their PYTHONPATH, as the workers see it); a module that
    registers its rewards with :func:`register_reward` at import. Problems name the module
    and the import error; a module calling ``sys.exit`` is one too. With ``timeout_s`` (the
    preflight) each module not imported yet is first imported in a child process stopped
    after ``timeout_s``, so a hanging import is a named problem, not a hung command.
    Imported once per process (Python's module cache)."""
    import importlib
    import sys

    out = []
    for i, name in enumerate(names):
        why = ""
        if timeout_s is not None and name not in sys.modules:
            if name not in _PROBED:
                _PROBED[name] = probe_import(name, timeout_s)
            why = _PROBED[name]
        if not why:
            try:
                importlib.import_module(name)
            except SystemExit as exc:  # a module must not end the process importing it
                why = f"SystemExit: the module called sys.exit({exc.code!r}) on import"
            except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
                why = f"{type(exc).__name__}: {exc}"
        if why:
            out.append(
                Problem(
                    f"task.reward_modules[{i}]",
                    f"cannot import {name!r} ({why}); it must be importable in the driver "
                    "and on every worker (installed, or on PYTHONPATH)",
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
    #: per rule: which samples it scored (rewards by data source leave some out; absent = all)
    applied: dict[str, list[bool]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # each sample's data_source ("" = none)

    def rule_means(self) -> dict[str, float]:
        """Each rule's mean over the samples it scored (``reward/<rule>``)."""
        out = {}
        for name, vals in self.per_reward.items():
            on = self.applied.get(name) or [True] * len(vals)
            got = [v for v, a in zip(vals, on, strict=True) if a]
            if got:
                out[name] = sum(got) / len(got)
        return out

    def source_means(self) -> dict[str, tuple[float, float, int]]:
        """(mean reward, accuracy, samples) per named data source."""
        out: dict[str, tuple[float, float, int]] = {}
        for src in dict.fromkeys(s for s in self.sources if s):
            idx = [i for i, s in enumerate(self.sources) if s == src]
            n = len(idx)
            out[src] = (
                sum(self.rewards[i] for i in idx) / n,
                sum(self.correct[i] for i in idx) / n,
                n,
            )
        return out


def source_rules(
    by_source: Mapping[str, str | Sequence[str]] | None, where: str = "task.reward_by_source"
) -> dict[str, tuple[str, ...]]:
    """``task.reward_by_source`` as {source or pattern: rule names}; every name must be a
    registered reward (ConfigError naming the key and the registered rewards)."""
    out: dict[str, tuple[str, ...]] = {}
    problems = []
    for src, rules in (by_source or {}).items():
        names = (rules,) if isinstance(rules, str) else tuple(rules)
        if not names:
            problems.append(Problem(f"{where}[{src!r}]", "names no reward"))
        bad = [n for n in names if n not in _REGISTRY]
        if bad:
            problems.append(
                Problem(
                    f"{where}[{src!r}]",
                    f"unknown reward(s) {bad}; registered: {sorted(_REGISTRY)}",
                )
            )
        out[str(src)] = names
    if problems:
        raise ConfigError(problems)
    return out


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
        by_source: Mapping[str, str | Sequence[str]] | None = None,
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
        self.by_source = source_rules(by_source)
        self._route_cache: dict[str, tuple[str, ...] | None] = {}
        self._extra: list[tuple[str, RewardFn]] = []  # routed rules not in task.rewards
        self._set_columns(self.by_source.values())
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
        by_source = getattr(task, "reward_by_source", None)
        if by_source and not any(r in CORRECTNESS_REWARDS for r in task.rewards):
            # the task scores with its own rules: only the keys the user wrote route
            from rpeg import defaults

            by_source = {
                k: v
                for k, v in by_source.items()
                if k not in defaults.REWARD_BY_SOURCE or defaults.REWARD_BY_SOURCE[k] != v
            }
        return cls(
            task.rewards,
            max_error_share=task.max_reward_error_share,
            timeout_s=task.reward_timeout_s,
            modules=modules,
            by_source=by_source,
        )

    @property
    def names(self) -> list[str]:
        """The rules in the order of :attr:`RewardResult.per_reward` (a batch's
        ``reward_parts`` columns): the task's, then the routed ones it does not hold."""
        return list(dict.fromkeys(n for n, _ in [*self.fns, *self._extra]))

    # --- rewards by data source ------------------------------------------------------------
    def _set_columns(self, routed: Sequence[Sequence[str]]) -> None:
        have = {n for n, _ in self.fns}
        extra = [n for rules in routed for n in rules if n not in have]
        self._extra = [(n, get_reward(n)) for n in dict.fromkeys(extra)]

    def route(self, source: str) -> tuple[str, ...] | None:
        """The rules that replace the correctness rules for ``source`` (None: not routed)."""
        if not source or not self.by_source:
            return None
        if source not in self._route_cache:
            got = self.by_source.get(source)
            if got is None:
                got = next(
                    (r for k, r in self.by_source.items() if fnmatch.fnmatchcase(source, k)),
                    None,
                )
            self._route_cache[source] = got
        return self._route_cache[source]

    def use_sources(self, sources: Sequence[str]) -> None:
        """Keep only the routed rules that ``sources`` (the data's sources) use as columns,
        so a batch's ``reward_parts`` hold no rule that never scores a row of this data."""
        used = [r for r in (self.route(s) for s in dict.fromkeys(sources)) if r is not None]
        self._set_columns(used)

    def rules_for(self, source: str) -> list[str]:
        """The names of the rules that score a sample of ``source``."""
        routed = self.route(source)
        base = [n for n, _ in self.fns]
        if routed is None:
            return base
        return list(dict.fromkeys([*(n for n in base if n not in CORRECTNESS_REWARDS), *routed]))

    def _correctness_of(self, rules: Sequence[str]) -> str:
        corr = [n for n in rules if n in CORRECTNESS_REWARDS]
        return corr[0] if corr else (self.correctness if self.correctness in rules else rules[0])

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
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        refs: Sequence[str],
        sources: Sequence[str] | None = None,
    ) -> RewardResult:
        """Score every sample; ``sources``: each sample's ``data_source`` (rewards by source,
        module doc; None or "" = the task's rules)."""
        items = list(zip(prompts, responses, refs, strict=True))
        srcs = [str(x or "") for x in (sources or [""] * len(items))]
        if len(srcs) != len(items):
            raise ValueError(f"{len(srcs)} sources for {len(items)} samples")
        rules = {src: self.rules_for(src) for src in dict.fromkeys(srcs)}
        per: dict[str, list[float]] = {}
        applied: dict[str, list[bool]] = {}
        errors = 0
        msgs: list[str] = []
        for name, fn in [*self.fns, *self._extra]:
            on = [name in rules[s] for s in srcs]
            if name in per or not any(on):
                if name not in per:
                    per[name], applied[name] = [0.0] * len(items), on
                continue
            mine = [it for it, o in zip(items, on, strict=True) if o]
            if self._isolate(name, fn):
                outcomes = verifier_pool().map(name, fn, mine, self.timeout_s, self.modules)
                if (
                    not needs_main_thread(name)
                    and outcomes
                    and all(NOT_REGISTERED in err for _, err in outcomes)
                ):  # registered at run time, not by importing its module: inline from now
                    self._inline.add(name)
                    outcomes = [call_reward(fn, *it) for it in mine]
            else:
                outcomes = [call_reward(fn, *it) for it in mine]
            scored = iter(outcomes)
            vals = []
            for o in on:
                if not o:
                    vals.append(0.0)
                    continue
                v, err = next(scored)
                if v is not None and not math.isfinite(v):
                    v, err = None, f"ValueError: non-finite reward {v}"
                if v is None:  # a broken reward must never kill the step on its own
                    errors += 1
                    if len(msgs) < 5:
                        msgs.append(f"{name}: {err}")
                    v = 0.0
                vals.append(v)
            per[name], applied[name] = vals, on
        calls = sum(len(rules[s]) for s in srcs)
        if self.max_error_share is not None and calls and errors / calls > self.max_error_share:
            raise RewardErrorShare(
                f"{errors} of {calls} reward calls raised ({errors / calls:.0%} > "
                f"task.max_reward_error_share={self.max_error_share:g}); first: "
                + "; ".join(msgs[:3])
            )
        total = [sum(vs) for vs in zip(*per.values(), strict=True)] if items else []
        corr = {src: self._correctness_of(r) for src, r in rules.items()}
        correct = [1.0 if per[corr[s]][i] >= 1.0 else 0.0 for i, s in enumerate(srcs)]
        routed = any(self.route(s) is not None for s in rules)
        return RewardResult(total, correct, errors, per, msgs, applied if routed else {}, srcs)
