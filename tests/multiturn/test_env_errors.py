"""Environment calls that hang, raise or return non-text become counted error samples; the
step goes on within the time limit; concurrency stays bounded."""

import threading
import time

import pytest

from rpeg.runtime.data import Example
from rpeg.runtime.envs import tools as T
from rpeg.runtime.envs.base import EnvStep, ToolEnv
from rpeg.runtime.envs.rollout import multiturn_rollout
from rpeg.runtime.envs.runner import EnvRunner

from .scripted import EOS, ScriptedWorker, ch, multiturn

CALL = ch("<tool>calc(12*7)</tool>")


def _hang(arg):
    threading.Event().wait(30)  # a daemon thread: left behind, never joined
    return "84"


def _raise(arg):
    raise RuntimeError("tool crashed")


def _not_text(arg):
    return 84


@pytest.mark.parametrize(
    ("fn", "reason"),
    [(_hang, "env_timeout"), (_raise, "env_error"), (_not_text, "env_bad_result")],
)
def test_tool_failure_is_a_counted_error_sample(monkeypatch, fn, reason):
    monkeypatch.setitem(T.TOOLS, "calc", T.Tool("calc", fn, "test"))
    # row 0 calls the failing tool, row 1 answers at once
    w = ScriptedWorker([[(CALL, -0.1, False), (ch("84") + [EOS], -0.1, True)]])
    runner = EnvRunner(timeout_s=0.3, concurrency=2)
    t0 = time.monotonic()
    b, m = multiturn_rollout(w, [Example("q", "84")], 2, multiturn(), runner=runner)
    assert time.monotonic() - t0 < 5.0
    assert m["env_errors"] == 1.0
    assert m[f"env_error/{reason}"] == 1.0
    assert len(w.calls) == 1  # the failed sample got no second turn
    assert b.response_ids[0].tolist() == CALL  # its tokens are kept, nothing appended
    assert m["env_reward_mean"] == 0.5  # row 1: right


def test_refused_argument_is_an_observation_not_an_error():
    env = ToolEnv(["calc"])
    env.reset(Example("q", "1"))
    st = env.step("<tool>calc(__import__('os'))</tool>")
    assert st == EnvStep("<error>not allowed: Call</error>", 0.0, False, True)
    st = env.step("<tool>shell(ls)</tool>")
    assert st.observation == "<error>unknown tool; use calc</error>" and not st.done


def test_final_answer_ends_the_episode():
    env = ToolEnv(["calc"])
    assert env.reset(Example("7 boxes of 12 pens. Pens?", "84")) == "7 boxes of 12 pens. Pens?"
    assert env.step("<tool>calc(7*12)</tool>") == EnvStep("<result>84</result>", 0.0, False, True)
    assert env.step("84") == EnvStep("", 1.0, True, False)


def test_runner_bounds_concurrency_and_time():
    lock = threading.Lock()
    now = [0]
    peak = [0]

    def call():
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.1)
        with lock:
            now[0] -= 1
        return EnvStep("ok", 0.0, False)

    runner = EnvRunner(timeout_s=2.0, concurrency=2)
    out = runner.run_all([call] * 6)
    assert [o.step.observation for o in out] == ["ok"] * 6
    assert peak[0] == 2


def test_hung_calls_hold_their_slots_and_later_calls_time_out():
    runner = EnvRunner(timeout_s=0.2, concurrency=1)
    stop = threading.Event()
    first = runner.run_all([lambda: (stop.wait(10), EnvStep("late", 0.0, False))[1]])
    assert first[0].error == "env_timeout"
    t0 = time.monotonic()
    second = runner.run_all([lambda: EnvStep("ok", 0.0, False)])
    assert second[0].error == "env_timeout"  # the only slot is still held
    assert time.monotonic() - t0 < 1.0
    stop.set()  # the hung call returns and frees its slot
    time.sleep(0.1)
    assert runner.run_all([lambda: EnvStep("ok", 0.0, False)])[0].step.observation == "ok"


def test_reset_failure_is_an_error_sample(monkeypatch):
    from rpeg.runtime.envs import base

    class Broken(ToolEnv):
        def reset(self, task):
            raise OSError("no sandbox")

    monkeypatch.setitem(base.ENVIRONMENTS, "tools", lambda tools, template: Broken(tools))
    w = ScriptedWorker([])
    b, m = multiturn_rollout(w, [Example("q", "1")], 2, multiturn())
    assert m["env_error/env_error"] == 2.0 and w.calls == []
    assert b.response_mask.sum() == 0  # nothing to train on
