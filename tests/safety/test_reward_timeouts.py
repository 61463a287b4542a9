"""Reward time limits in both runtimes, concurrent (issue 28 probe 6): in ``--local`` a hanging
reward hung the run forever (rewards ran on the main thread with no limit), and in the
distributed runtime timed-out samples ran one after another (30 s x 64 held-out samples over
two children ~ 16 min). A reward calling ``sys.exit(3)`` ended the run with exit 3 and no
message."""

from __future__ import annotations

import sys
import textwrap
import threading

import pytest

from rpeg.config import TaskConfig
from rpeg.runtime.rewards import RewardSet

MODULE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from rpeg.runtime.rewards import register_reward

    @register_reward("hang_issue28", overwrite=True)
    def hang(prompt, response, reference):
        if response == "hang":
            time.sleep(600)
        return 1.0

    @register_reward("barrier_issue28", overwrite=True)
    def barrier(prompt, response, reference):
        # reference: "<folder>|<n>": mark this sample started, then wait until n have started
        folder, n = reference.split("|")
        Path(folder, response).touch()
        deadline = time.monotonic() + 120
        while len(os.listdir(folder)) < int(n):
            if time.monotonic() > deadline:
                raise TimeoutError("the others never started")
            time.sleep(0.05)
        return 1.0

    @register_reward("exits_issue28", overwrite=True)
    def exits(prompt, response, reference):
        if response == "exit":
            sys.exit(3)
        return 1.0
    """
)


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "timeouts_issue28.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("timeouts_issue28", None)
    return "timeouts_issue28"


def _rewards(module: str, name: str, timeout_s: float) -> RewardSet:
    task = TaskConfig(rewards=[name], reward_modules=[module], reward_timeout_s=timeout_s)
    return RewardSet.from_task(task)


@pytest.mark.timeout(300)
def test_a_hanging_reward_times_out_on_the_main_thread(reward_module):
    """The local trainer scores on the main thread (``--local``): the limit applies there."""
    assert threading.current_thread() is threading.main_thread()
    rs = _rewards(reward_module, "hang_issue28", timeout_s=2.0)
    res = rs(["p"] * 3, ["ok", "hang", "ok"], ["", "", ""])
    assert res.rewards == [1.0, 0.0, 1.0]
    assert res.errors == 1 and "TimeoutError" in res.error_messages[0]


@pytest.mark.timeout(600)
def test_slow_samples_are_scored_concurrently(reward_module, tmp_path):
    """Six samples that each wait until all six have started: scored one after another (or
    two at a time) none would finish; the pool grows past its two base children."""
    folder = tmp_path / "started"
    folder.mkdir()
    rs = _rewards(reward_module, "barrier_issue28", timeout_s=90.0)
    n = 6
    res = rs(["p"] * n, [f"s{i}" for i in range(n)], [f"{folder}|{n}"] * n)
    assert res.errors == 0, res.error_messages
    assert res.rewards == [1.0] * n


def test_sys_exit_in_a_reward_is_an_error_sample(reward_module):
    """In the calling thread (a ``(name, fn)`` pair) and in the pool alike."""

    def exits(prompt, response, reference):
        sys.exit(3)

    inline = RewardSet([("exits_inline", exits)])(["p"], ["r"], [""])
    assert inline.rewards == [0.0] and inline.errors == 1
    assert inline.error_messages == ["exits_inline: SystemExit: the reward called sys.exit(3)"]
    rs = _rewards(reward_module, "exits_issue28", timeout_s=30.0)
    res = rs(["p", "p"], ["exit", "ok"], ["", ""])
    assert res.rewards == [0.0, 1.0] and res.errors == 1
    assert res.error_messages == ["exits_issue28: SystemExit: the reward called sys.exit(3)"]


def test_a_reward_a_child_cannot_import_runs_in_the_calling_thread(tmp_path):
    """A module loaded from a file path (not importable by name): the pool's child cannot
    build the reward, so it is scored where it is called (without a limit), not as errors."""
    import importlib.util

    path = tmp_path / "loose_rewards.py"
    path.write_text(
        "from rpeg.runtime.rewards import register_reward\n"
        "@register_reward('loose_issue28', overwrite=True)\n"
        "def loose(prompt, response, reference):\n"
        "    return float(len(response))\n"
    )
    spec = importlib.util.spec_from_file_location("loose_rewards_issue28", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    res = RewardSet(["loose_issue28"])(["p", "p"], ["ab", "abc"], ["", ""])
    assert res.errors == 0, res.error_messages
    assert res.rewards == [2.0, 3.0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rpeg_train_local_finishes_with_a_reward_that_hangs(tmp_path):
    """The probe itself: ``rpeg train --local`` with a reward that hangs on about a quarter of
    the samples hung forever; now those samples time out (errors, counted) and the run ends."""
    import json
    import os
    import subprocess

    (tmp_path / "hang_rw28.py").write_text(
        "import time, zlib\n"
        "from rpeg.runtime.rewards import register_reward\n"
        "@register_reward('sometimes_hangs_issue28')\n"
        "def sometimes_hangs(prompt, response, reference):\n"
        "    if zlib.crc32(response.encode()) % 4 == 0:\n"
        "        time.sleep(3600)\n"
        "    return 1.0 if response.strip() == str(reference).strip() else 0.0\n"
    )
    cfg = {
        "task": {
            "rewards": ["sometimes_hangs_issue28"],
            "reward_modules": ["hang_rw28"],
            "reward_timeout_s": 2,
            "max_reward_error_share": 1.0,
            "heldout_size": 4,
        },
        "runtime": {"steps": 1, "output_dir": str(tmp_path / "out")},
    }
    (tmp_path / "run.yaml").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    got = subprocess.run(
        [sys.executable, "-c", "import sys; from rpeg.cli import main; sys.exit(main())"]
        + ["train", str(tmp_path / "run.yaml"), "--local", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    (line,) = (tmp_path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["reward_errors"] > 0  # the hanging samples, timed out


class _BarrierScorer:
    """A Dask actor scoring as RankActor's reward stage does (on a worker thread)."""

    def score(self, module_dir, folder, n):
        sys.path.insert(0, module_dir)
        task = TaskConfig(
            rewards=["barrier_issue28"], reward_modules=["timeouts_issue28"], reward_timeout_s=90
        )
        res = RewardSet.from_task(task)(
            ["p"] * n, [f"s{i}" for i in range(n)], [f"{folder}|{n}"] * n
        )
        return res.rewards, res.errors, res.error_messages


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_slow_samples_are_scored_concurrently_on_a_dask_actor(reward_module, tmp_path):
    """The distributed runtime's side: the same six waiting samples from an actor's thread."""
    distributed = pytest.importorskip("distributed")
    folder = tmp_path / "started"
    folder.mkdir()
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            worker_class="distributed.Nanny",
        ) as lc,
        distributed.Client(lc) as client,
    ):
        actor = client.submit(_BarrierScorer, actor=True).result()
        rewards, errors, msgs = actor.score(str(tmp_path), str(folder), 6).result()
    assert errors == 0, msgs
    assert rewards == [1.0] * 6
