"""Runs own their folders (issue 44, item 1): a run locks its run folder and its checkpoint
location for its run id; a second writer is refused before start (exit 2) naming the owner;
a stale lock (a dead process on this host) is taken over; appends are whole lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rpeg.runtime import run_folder as RF

FAST = [
    "runtime.steps=1",
    "optim.warmup_sft_steps=0",
    "workload.num_prompts=2",
    "workload.samples_per_prompt=2",
    "task.heldout_size=2",
]


@pytest.fixture
def sleeper():
    """A live process of this host that is not this one (the lock's 'other owner')."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def _plant_lock(folder, pid, run_id="other-run"):
    folder.mkdir(parents=True, exist_ok=True)
    owner = {"host": socket.gethostname(), "pid": pid, "run_id": run_id, "started": time.time()}
    (folder / RF.LOCK_FILE).write_text(json.dumps(owner))


def test_a_second_writer_of_a_run_folder_is_refused_naming_the_owner(tmp_path, sleeper, capsys):
    from rpeg.cli import main

    _plant_lock(tmp_path / "out" / "r1", sleeper.pid)
    code = main(["train", "--local", "--out", str(tmp_path / "out"), "--run-id", "r1", *FAST])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"pid {sleeper.pid} on host {socket.gethostname()}" in err
    assert "run other-run" in err
    assert not (tmp_path / "out" / "r1" / "metrics.jsonl").exists()  # nothing started


def test_a_second_writer_of_a_checkpoint_location_is_refused(tmp_path, sleeper):
    """Other output folders, the same checkpoint URL and run id: the checkpoints would mix."""
    from rpeg.config import RunConfig
    from rpeg.preflight.prepare import prepare_run

    ck = tmp_path / "ck"
    _plant_lock(ck / "r1", sleeper.pid, run_id="r1")
    cfg = RunConfig().with_overrides(
        {
            "runtime.output_dir": str(tmp_path / "mine"),
            "runtime.checkpoint_url": str(ck),
            "runtime.run_id": "r1",
            "optim.warmup_sft_steps": 0,
        }
    )
    with pytest.raises(
        RF.RunLocked, match=f"checkpoint location .*pid {sleeper.pid}.*runtime.checkpoint_url"
    ):
        prepare_run(cfg, local=True)
    assert not (tmp_path / "mine" / "r1" / RF.LOCK_FILE).exists()  # nothing half-held


def test_a_stale_lock_is_taken_over_and_released(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _plant_lock(tmp_path / "r1", dead.pid)
    lease = RF.lock_run(tmp_path / "r1", None, "r1")
    assert [o["pid"] for o in lease.took_over] == [dead.pid]
    mine = json.loads((tmp_path / "r1" / RF.LOCK_FILE).read_text())
    assert mine["pid"] == os.getpid() and mine["run_id"] == "r1"
    lease.release()
    assert not (tmp_path / "r1" / RF.LOCK_FILE).exists()


def test_the_held_lock_refuses_another_process(tmp_path):
    lease = RF.lock_run(tmp_path / "r1", None, "r1")
    try:
        got = subprocess.run(
            [
                sys.executable,
                "-c",
                "from rpeg.runtime.run_folder import lock_run\n"
                f"lock_run({str(tmp_path / 'r1')!r}, None, 'x')",
            ],
            capture_output=True,
            text=True,
        )
        assert got.returncode != 0
        assert f"pid {os.getpid()}" in got.stderr and "RunLocked" in got.stderr
    finally:
        lease.release()


def test_appends_from_two_processes_are_whole_lines(tmp_path):
    """Two writers appending 300 lines of ~20 KB each (over any buffer size) to one file:
    every line parses, none is lost."""
    path = tmp_path / "metrics.jsonl"
    code = (
        "import json, sys\n"
        "from rpeg.runtime.run_folder import append_lines\n"
        "w = sys.argv[1]\n"
        "for i in range(300):\n"
        "    append_lines(sys.argv[2], [json.dumps({'w': w, 'i': i, 'pad': w * 20000})])\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, w, str(path)]) for w in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted((r["w"], r["i"]) for r in rows) == sorted(
        (w, i) for w in ("a", "b") for i in range(300)
    )
