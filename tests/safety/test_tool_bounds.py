"""Issue 44, item 3: a tool call is bounded in time and memory by something that can stop it.
The calculator refuses a result too large *before* computing it, and built-in tools run in a
child process with memory and CPU limits that is killed at the timeout."""

from __future__ import annotations

import os
import sys
import time

import pytest

from rpeg.runtime.data import Example
from rpeg.runtime.envs.base import ToolEnv
from rpeg.runtime.envs.calculator import MAX_BITS, CalcError, calc
from rpeg.runtime.envs.runner import EnvRunner
from rpeg.runtime.envs.tool_sandbox import ToolPool, ToolTimeout, tool_pool

# 43 characters: a small value whose exact denominator is 7**(8**8) -- minutes of big-int work
NESTED = "((((((((1/7)**8)**8)**8)**8)**8)**8)**8)**8"


def test_a_small_expression_with_a_huge_exact_value_is_refused_before_computing():
    t0 = time.monotonic()
    with pytest.raises(CalcError, match=f"over {MAX_BITS} bits"):
        calc(NESTED)
    assert time.monotonic() - t0 < 0.5
    assert calc("(1/7)**8*7**8") == "1"  # a precise value under the bound is still exact


def test_the_tool_env_answers_the_expression_within_its_timeout():
    env = ToolEnv(["calc"], timeout_s=2.0)
    env.reset(Example("q", "1"))
    t0 = time.monotonic()
    st = env.step(f"<tool>calc({NESTED})</tool>")
    assert time.monotonic() - t0 < 3.0
    assert st.observation.startswith("<error>result too precise")


def test_a_hanging_tool_process_is_killed_at_the_timeout():
    hang = "import time; print('{\"ready\": true}', flush=True); input(); time.sleep(600)"
    pool = ToolPool([sys.executable, "-c", hang])
    pool.warm()
    child = pool._idle[0]
    t0 = time.monotonic()
    with pytest.raises(ToolTimeout, match="within 0.5 s"):
        pool.call("calc", "1+1", 0.5)
    assert time.monotonic() - t0 < 3.0
    assert child.proc.poll() is not None  # the process is gone, not left burning CPU
    assert not pool._idle


def test_the_runner_counts_a_killed_tool_as_a_timeout():
    def call():
        raise ToolTimeout("tool 'calc' gave no result within 1 s (killed)")

    (out,) = EnvRunner(timeout_s=5, concurrency=1).run_all([call])
    assert out.error == "env_timeout" and "killed" in out.detail


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_tool_process_runs_under_memory_and_cpu_limits():
    pool = tool_pool()
    assert pool.call("calc", "6*7", 5.0) == {"result": "42"}
    (child,) = [c for c in pool._idle if c.proc.poll() is None][:1]
    with open(f"/proc/{child.proc.pid}/limits") as fh:
        limits = {" ".join(line.split()[:3]): line.split()[3] for line in fh if line.strip()}
    assert limits["Max address space"] != "unlimited"
    assert int(limits["Max address space"]) < 4 * 2**30
    assert limits["Max cpu time"] != "unlimited"
    assert child.proc.pid != os.getpid()
