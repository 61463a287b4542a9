"""Rewards are safe: model text is never code, and threads score what the main thread does."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest

from rpeg.config import TaskConfig
from rpeg.runtime.rewards import (
    RewardErrorShare,
    RewardSet,
    math_equivalence,
    parse_rational,
    register_reward,
)

# (response, reference, hand-worked value)
CASES = [
    ("1/2", "0.5", 1.0),
    ("\\frac{1}{2}", "0.5", 1.0),
    ("$\\boxed{4}$", "4", 1.0),
    ("<answer>7</answer>", "7", 1.0),
    ("x", "0.5", 0.0),
    ("3", "4", 0.0),
    ("<answer>12</answer>", "#### 12", 1.0),
]


def _in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["e"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    if "e" in box:
        raise box["e"]
    return box["v"]


def test_crafted_response_executes_nothing(tmp_path):
    """The old sympify fallback ran this (``#`` comments out the rest; math-verify parses
    nothing because ``\\boxed`` has no brace): it created the marker file."""
    marker = tmp_path / "pwned"
    payloads = [
        f"__import__('os').system('touch {marker}') #\\boxed",
        f"<answer>__import__('os').system('touch {marker}')</answer>",
        f"(lambda: __import__('os').system('touch {marker}'))() #\\boxed",
    ]
    for p in payloads:
        assert math_equivalence("", p, "1") == 0.0
        # a crafted *reference* is data too
        assert math_equivalence("", "1", p) == 0.0
    rs = RewardSet(["math_equivalence"], isolation="process")
    assert rs([""] * 3, payloads, ["1"] * 3).rewards == [0.0, 0.0, 0.0]
    assert not marker.exists()


def test_parse_rational_hand_worked():
    assert parse_rational("1/2") == Fraction(1, 2)
    assert parse_rational("-1,234.5") == Fraction(-2469, 2)
    assert parse_rational("\\frac{3}{4}") == Fraction(3, 4)
    assert parse_rational("$\\boxed{2^{10}}$") == 1024
    assert parse_rational("(1+2)*3 - 4/2") == 7
    for bad in ("x", "__import__('os')", "2**999999", "1/0", "", "1e5", "(1", "9" * 500):
        assert parse_rational(bad) is None, bad


def test_math_equivalence_same_on_a_thread_as_on_the_main_thread():
    """math-verify's signal.alarm raised off the main thread: every sample scored 0 (an error)."""
    rs = RewardSet(["math_equivalence"])
    prompts = [""] * len(CASES)
    responses = [c[0] for c in CASES]
    refs = [c[1] for c in CASES]
    expect = [c[2] for c in CASES]
    main = rs(prompts, responses, refs)
    off = _in_thread(lambda: rs(prompts, responses, refs))
    assert main.rewards == expect and main.errors == 0
    assert off.rewards == expect and off.errors == 0, off.error_messages


def test_math_equivalence_on_a_dask_actor_matches_in_process():
    distributed = pytest.importorskip("distributed")
    # default (daemonic) worker processes: the verifier's children are plain subprocesses
    responses = [c[0] for c in CASES]
    refs = [c[1] for c in CASES]
    with (
        distributed.LocalCluster(  # a worker process, the actor on one of its threads
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            worker_class="distributed.Nanny",
        ) as lc,
        distributed.Client(lc) as client,
    ):
        actor = client.submit(Scorer, actor=True).result()
        on_main = actor.on_main_thread().result()
        rewards, errors = actor.score(responses, refs).result()
    assert on_main is False  # the situation that broke math-verify
    assert errors == 0
    assert rewards == RewardSet(["math_equivalence"])([""] * len(CASES), responses, refs).rewards


class Scorer:
    """A Dask actor scoring with math_equivalence (as RankActor's reward stage does)."""

    def score(self, responses, refs):
        rs = RewardSet(["math_equivalence"])
        res = rs([""] * len(responses), responses, refs)
        return res.rewards, res.errors

    def on_main_thread(self):
        return threading.current_thread() is threading.main_thread()


@register_reward("slow_test_reward", needs_main_thread=True, overwrite=True)
def slow_test_reward(prompt: str, response: str, reference_answer: str) -> float:
    if response == "hang":
        time.sleep(600)
    return 1.0


def test_pool_wall_clock_limit_scores_a_hang_as_an_error():
    rs = RewardSet(["slow_test_reward"], isolation="process", timeout_s=3.0)
    res = rs(["", "", "", ""], ["ok", "hang", "ok", "ok"], ["", "", "", ""])
    assert res.rewards == [1.0, 0.0, 1.0, 1.0]
    assert res.errors == 1 and "TimeoutError" in res.error_messages[0]
    # the pool recovered: the next batch is scored normally
    assert rs([""], ["ok"], [""]).rewards == [1.0]


def test_error_share_fails_the_step_loudly():
    def boom(prompt, response, reference_answer):
        raise RuntimeError("kaput")

    rs = RewardSet([("boom", boom)], max_error_share=0.5)
    with pytest.raises(RewardErrorShare, match=r"2 of 2 reward calls raised"):
        rs(["p", "p"], ["a", "b"], ["1", "1"])

    def half(prompt, response, reference_answer):
        if response == "bad":
            raise RuntimeError("kaput")
        return 1.0

    # exactly half is allowed by 0.5; the config default is a share, in the config
    ok = RewardSet([("half", half)], max_error_share=0.5)(["p", "p"], ["ok", "bad"], ["", ""])
    assert ok.errors == 1
    rs_cfg = RewardSet.from_task(TaskConfig(rewards=["exact_numeric"]))
    assert rs_cfg.max_error_share == TaskConfig().max_reward_error_share
