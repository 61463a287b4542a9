"""Where a run writes (issue 28 low probes): ``--local`` wrote through symbolic links planted
in the output folder, and ``memory://`` checkpoints were accepted and lost at exit."""

from __future__ import annotations

import os

import yaml

from rpeg.config import RunConfig
from rpeg.preflight import check_places


def _cfg(out, checkpoint_url=None):
    return RunConfig.from_dict(
        {"runtime": {"output_dir": str(out), "checkpoint_url": checkpoint_url}}
    )


def _texts(problems):
    return [f"{p.where}: {p.what}" for p in problems]


def test_memory_checkpoints_are_refused_naming_the_field_and_the_schemes(tmp_path):
    got = _texts(check_places(_cfg(tmp_path / "out", "memory://ck"), local=True))
    assert len(got) == 1, got
    assert got[0].startswith("runtime.checkpoint_url: 'memory://ck': memory:// keeps data")
    assert "a local path, file://, s3://" in got[0]
    assert check_places(_cfg(tmp_path / "out", str(tmp_path / "ck")), local=True) == []


def test_a_link_planted_in_the_output_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, out / "metrics.jsonl")
    os.symlink(tmp_path / "nowhere", out / "reward_curve.png")  # dangling: open() creates it
    elsewhere = tmp_path / "big-disk"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "checkpoints")  # a folder: a deliberate layout, allowed
    got = _texts(check_places(_cfg(out), local=True))
    assert len(got) == 2, got
    assert got[0].startswith(f"runtime.output_dir: '{out / 'metrics.jsonl'}' is a symbolic link")
    assert f"to '{victim}' (a file)" in got[0]
    assert "(nothing (a dangling link))" in got[1] and "reward_curve.png" in got[1]


def test_rpeg_train_local_stops_before_writing_through_the_link(tmp_path, capsys):
    from rpeg.cli import main

    out = tmp_path / "out" / "r1"  # the run folder of run r1 (output_dir/run id)
    out.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, out / "metrics.jsonl")
    cfg = {"runtime": {"output_dir": str(out.parent), "checkpoint_url": "memory://ck", "steps": 1}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(["train", str(path), "--local", "--quiet", "--run-id", "r1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "runtime.checkpoint_url" in err and "is a symbolic link" in err
    assert victim.read_text() == "keep me"
