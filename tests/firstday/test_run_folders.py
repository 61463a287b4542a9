"""Each run in its own folder (issue 41 item 5, issue 44 item 1): ``<output_dir>/<run id>/``
holds the resolved config.yaml, metrics, samples, TensorBoard and the curve; ``latest``
points at the newest; runs sharing an output_dir keep each other's files."""

from __future__ import annotations

import os

from rpeg.config import RunConfig
from rpeg.runtime import run_folder as RF

FAST = [
    "runtime.steps=1",
    "optim.warmup_sft_steps=0",
    "workload.num_prompts=2",
    "workload.samples_per_prompt=2",
    "task.heldout_size=2",
]


def test_a_run_writes_its_own_folder_with_its_config(tmp_path, capsys):
    from rpeg.cli import main

    out = tmp_path / "runs"
    (out / "old").mkdir(parents=True)
    (out / "old" / "metrics.jsonl").write_text('{"step": 1}\n')  # an earlier run's
    (out / "latest").mkdir()  # outputs of a run from before run folders
    (out / "latest" / "metrics.jsonl").write_text('{"step": 7}\n')
    code = main(["train", "--local", "--out", str(out), *FAST])
    said = capsys.readouterr().out
    assert code == 0, said
    (kept,) = out.glob("latest.before-*")  # kept, not deleted, and said so
    assert (kept / "metrics.jsonl").read_text() == '{"step": 7}\n' and f"kept as {kept}" in said
    (folder,) = [p for p in out.iterdir() if p.name not in ("old", "latest", kept.name)]
    assert (out / "latest").is_symlink() and (out / "latest").resolve() == folder.resolve()
    assert f"outputs in {folder}/" in said
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "reward_curve.png", "tb"):
        assert (folder / name).exists(), name
    assert (out / "old" / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    cfg = RunConfig.from_yaml(str(folder / "config.yaml"))  # loads as a run config
    assert cfg.runtime.run_id == folder.name and cfg.runtime.output_dir == str(folder)
    assert cfg.runtime.steps == 1 and not cfg.runtime.resume  # the run as it ran
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 1
    assert not (folder / RF.LOCK_FILE).exists()  # released at the end


def test_two_runs_sharing_an_output_dir_keep_both(tmp_path):
    from rpeg.preflight.prepare import prepare_run

    base = RunConfig().with_overrides(
        {"runtime.output_dir": str(tmp_path / "runs" / "latest"), "optim.warmup_sft_steps": 0}
    )
    a = prepare_run(base, local=True)
    b = prepare_run(base, local=True)  # both running at once: no clash
    try:
        assert a.folder != b.folder and a.folder.parent == b.folder.parent == tmp_path / "runs"
        assert a.config.runtime.run_id != b.config.runtime.run_id
        assert (tmp_path / "runs" / "latest").resolve() == b.folder.resolve()
        for p in (a, b):
            got = RunConfig.from_yaml(str(p.folder / "config.yaml"))
            assert got.runtime.output_dir == str(p.folder)
    finally:
        a.release()
        b.release()
    again = prepare_run(a.config, local=True)  # a prepared config: the same folder, no nesting
    again.release()
    assert again.folder == a.folder


def test_a_real_latest_folder_is_kept_not_deleted(tmp_path):
    (tmp_path / "latest").mkdir()
    (tmp_path / "latest" / "metrics.jsonl").write_text("mine\n")
    new = tmp_path / "run-2"
    new.mkdir()
    assert RF.point_latest(new) is not None
    assert os.readlink(tmp_path / "latest") == "run-2"
    (kept,) = tmp_path.glob("latest.before-*")
    assert (kept / "metrics.jsonl").read_text() == "mine\n"


def test_a_run_folder_names_its_checkpoints(tmp_path):
    """What `rpeg export` / `rpeg eval` read from a run folder alone."""
    from rpeg.preflight.prepare import prepare_run

    cfg = RunConfig().with_overrides(
        {
            "runtime.output_dir": str(tmp_path / "runs"),
            "runtime.checkpoint_url": str(tmp_path / "ck"),
            "optim.warmup_sft_steps": 0,
        }
    )
    p = prepare_run(cfg, local=True)
    p.release()
    rid = p.config.runtime.run_id
    assert RF.checkpoints_of(tmp_path / "runs" / "latest") == f"{tmp_path / 'ck'}/{rid}"
    assert RF.checkpoints_of(tmp_path) is None  # not a run folder
