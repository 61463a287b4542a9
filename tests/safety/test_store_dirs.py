"""Issue 44, item 11: a killed driver's ``/tmp/rpeg-cluster-*`` folder is removed when the
next LocalCluster starts; a live owner's folder and other folders are left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from rpeg.infra import store_dirs
from rpeg.infra.store_dirs import OWNER, PREFIX, sweep_stale


def test_a_dead_owners_folder_is_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(store_dirs.tempfile, "tempdir", str(tmp_path))
    mine = store_dirs.make_store_dir()  # this process: alive
    assert os.path.dirname(mine) == str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a driver that is gone (killed, say), its folder left behind
    dead = tmp_path / f"{PREFIX}dead"
    dead.mkdir()
    (dead / OWNER).write_text(json.dumps({"pid": child.pid, "started": "1"}))
    (dead / "store-0").write_bytes(b"x" * 10)
    other = tmp_path / "not-rpeg"
    other.mkdir()
    assert sweep_stale(str(tmp_path)) == [str(dead)]
    assert os.path.isdir(mine) and other.is_dir() and not dead.exists()


def test_a_reused_pid_is_not_taken_for_the_owner(tmp_path):
    d = tmp_path / f"{PREFIX}reused"
    d.mkdir()
    # this process's pid, but another start time: the owner was an earlier process
    (d / OWNER).write_text(json.dumps({"pid": os.getpid(), "started": "0"}))
    assert sweep_stale(str(tmp_path)) == [str(d)]


def test_an_unowned_folder_goes_only_when_old(tmp_path):
    d = tmp_path / f"{PREFIX}older-rpeg"
    d.mkdir()
    assert sweep_stale(str(tmp_path)) == []
    later = time.time() + store_dirs.UNOWNED_AFTER_S + 60
    assert sweep_stale(str(tmp_path), now=later) == [str(d)]
