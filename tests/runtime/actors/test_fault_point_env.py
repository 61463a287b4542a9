"""The ``env`` fault point (issue 31 item 6): a rank generating a multi-turn rollout ends
itself as the environment steps of a chosen turn begin, half-way through its samples."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rpeg.runtime.actors.fault_points import ENABLE, ENV, FaultPoint


def test_an_env_point_names_its_turn_and_only_env_points_do():
    p = FaultPoint.parse("group=gen rank=0 phase=env step=2 turn=2 once=/tmp/x")
    assert p == FaultPoint("gen", 0, "env", 2, "/tmp/x", turn=2)
    assert FaultPoint.parse(p.format()) == p
    assert p.matches("gen", 0, "env", 2, 2)
    assert not p.matches("gen", 0, "env", 2, 1)  # turn 1's environment steps: not yet
    assert not p.matches("gen", 0, "env", 1, 2)  # another step's rollout
    with pytest.raises(ValueError, match="turn=T goes with phase=env"):
        FaultPoint.parse("group=gen rank=0 phase=env step=2 once=/x")
    with pytest.raises(ValueError, match="turn=T goes with phase=env"):
        FaultPoint.parse("group=gen rank=0 phase=train step=2 turn=1 once=/x")
    with pytest.raises(ValueError, match="turn must be >= 1"):
        FaultPoint.parse("group=gen rank=0 phase=env step=2 turn=0 once=/x")


def _script(lines: list[str], once, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, ENV: f"group=gen rank=0 phase=env step=2 turn=2 once={once}", ENABLE: "1"}
    code = "\n".join(["from rpeg.runtime.actors.fault_points import env_turn, fault_point", *lines])
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path
    )


def test_env_turn_ends_the_generating_rank_at_the_named_step_and_turn(tmp_path):
    once = tmp_path / "fired"
    r = _script(
        [
            "env_turn(2)",  # no generating unit started in this process: nothing
            "fault_point('gen', 0, 'generate', 1)",
            "env_turn(1); env_turn(2)",  # step 1's rollout: not the named step
            "fault_point('gen', 0, 'generate', 2)",
            "env_turn(1)",  # step 2, turn 1: not the named turn
            "print('alive', flush=True)",
            "env_turn(2)",
            "print('not reached')",
        ],
        once,
        tmp_path,
    )
    assert r.returncode == 137, r.stderr
    assert r.stdout.split() == ["alive"]
    assert once.read_text().startswith("gen 0 env 2 2 pid=")
    # the replacement process (same environment) passes the point: the once file exists
    again = _script(["fault_point('gen', 0, 'generate', 2)", "env_turn(2)"], once, tmp_path)
    assert again.returncode == 0, again.stderr
