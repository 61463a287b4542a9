"""Rewards (built-ins, errors, signatures) and data (sources, files, cursor state)."""

import json

import fsspec
import pytest

from rpeg.config import TaskConfig
from rpeg.errors import ConfigError
from rpeg.runtime.data import (
    ArithmeticSource,
    DataCursor,
    gsm8k_final_answer,
    load_examples,
)
from rpeg.runtime.rewards import (
    RewardSet,
    countdown,
    exact_numeric,
    format_reward,
    math_equivalence,
    register_reward,
)
from rpeg.runtime.task_data import build_task_data


def test_builtin_rewards():
    assert exact_numeric("", "42", "42") == 1.0
    assert exact_numeric("", "<answer>1,200</answer>", "#### 1200") == 1.0
    assert exact_numeric("", "41", "42") == 0.0
    assert exact_numeric("", "forty", "42") == 0.0
    assert math_equivalence("", "1/2", "0.5") == 1.0
    assert math_equivalence("", "x", "0.5") == 0.0
    assert format_reward("", "<think>a</think> <answer>3</answer>", "") == 1.0
    assert format_reward("", "3", "") == 0.0
    assert countdown("", "(3+5)*2", "16|3,5,2") == 1.0
    assert countdown("", "3*3", "9|3,5") == 0.0  # 3 used twice


def test_raising_reward_gives_zero_and_is_counted():
    def boom(prompt, response, reference_answer):
        if response == "bad":
            raise RuntimeError("kaput")
        return 1.0

    rs = RewardSet([("boom", boom)])
    res = rs(["p", "p"], ["ok", "bad"], ["1", "1"])
    assert res.rewards == [1.0, 0.0] and res.errors == 1 and "kaput" in res.error_messages[0]


def test_wrong_signature_is_rejected_at_registration():
    with pytest.raises(ConfigError, match="wrong signature"):
        register_reward("two_args", lambda prompt, response: 1.0)
    with pytest.raises(ConfigError, match="wrong signature"):
        RewardSet([("kw", lambda a, b, c, *, d: 1.0)])
    with pytest.raises(ConfigError, match="unknown reward"):
        RewardSet(["no_such_reward"])
    register_reward("ok_reward_test", lambda p, r, a, extra=0: 0.5, overwrite=True)
    assert RewardSet(["ok_reward_test"])(["p"], ["r"], ["a"]).rewards == [0.5]


def test_reward_set_sums_and_accuracy():
    rs = RewardSet(["format", "exact_numeric"])
    res = rs(["q", "q"], ["<answer>5</answer>", "5"], ["5", "6"])
    assert res.rewards == [2.0, 0.0] and res.correct == [1.0, 0.0]


def test_arithmetic_seeded_and_levels():
    a, b = ArithmeticSource(2, seed=1), ArithmeticSource(2, seed=1)
    assert [a[i] for i in range(5)] == [b[i] for i in range(5)]
    assert [a[i] for i in range(5)] != [ArithmeticSource(2, seed=2)[i] for i in range(5)]
    for d in range(1, 6):
        ex = ArithmeticSource(d)[3]
        assert eval(ex.question.rstrip("=")) == int(ex.answer)  # noqa: S307
    with pytest.raises(ConfigError):
        ArithmeticSource(9)


def test_heldout_excluded_from_training():
    cursor, held = build_task_data(TaskConfig(heldout_size=32))
    qs = {e.question for e in held}
    assert len(held) == 32
    assert not qs & {e.question for e in cursor.next(500)}


def test_cursor_round_trip_finite_and_infinite():
    data = [ArithmeticSource(1)[i] for i in range(7)]
    c = DataCursor(data, seed=3)
    c.next(10)  # crosses an epoch
    state = c.state_dict()
    expect = c.next(9)
    c2 = DataCursor(data, seed=0)
    c2.load_state_dict(json.loads(json.dumps(state)))
    assert c2.next(9) == expect
    inf = DataCursor(ArithmeticSource(1))
    inf.next(4)
    s = inf.state_dict()
    e = inf.next(3)
    inf2 = DataCursor(ArithmeticSource(1))
    inf2.load_state_dict(s)
    assert inf2.next(3) == e


def test_gsm8k_jsonl_via_fsspec():
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "Big?", "answer": "#### 1,234"},
    ]
    with fsspec.open("memory://rpeg-data/gsm.jsonl", "w") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows))
    ex = load_examples("memory://rpeg-data/gsm.jsonl")
    assert [e.answer for e in ex] == ["7", "1234"]
    assert ex[0].prompt("Q: {question}\nA:") == "Q: Tom has 3 apples and buys 4. How many?\nA:"
    assert gsm8k_final_answer("so #### 12") == "12"
    with pytest.raises(ConfigError, match="not found"):
        load_examples("memory://rpeg-data/missing.jsonl")
    with fsspec.open("memory://rpeg-data/bad.jsonl", "w") as fh:
        fh.write(json.dumps({"q": 1}))
    with pytest.raises(ConfigError, match="question"):
        load_examples("memory://rpeg-data/bad.jsonl")
