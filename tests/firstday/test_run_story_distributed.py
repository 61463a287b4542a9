"""The distributed ``rpeg train`` tells the run's story as ``--local`` does (issue 41, items 1
and 5): a line within 5 s of its start and never 10 s without one until the first step; the
warm-up computed once (one cache entry, its progress on the console); the held-out before /
after and checkpoint lines; the run in ``<output_dir>/<run id>/`` with its config.yaml, which
``rpeg calibrate`` takes alone. One end-to-end run on a Dask LocalCluster: slow."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rpeg.config import RunConfig


@pytest.mark.slow
def test_the_distributed_run_story_from_start_to_calibrate(tmp_path):
    env = dict(os.environ, RPEG_CACHE=str(tmp_path / "cache"))
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-c", "import sys; from rpeg.cli import main; sys.exit(main())"]
    args = ["train", "--out", str(tmp_path / "runs"), "runtime.steps=2"]
    args += ["optim.warmup_sft_steps=20", "workload.num_prompts=2", "task.heldout_size=4"]
    args += ["workload.samples_per_prompt=2", f"runtime.checkpoint_url={tmp_path / 'ck'}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    stamps: list[tuple[float, str]] = []
    for line in proc.stdout:
        stamps.append((time.monotonic() - t0, line.rstrip()))
    assert proc.wait(timeout=900) == 0, stamps[-30:]
    said = [s for _, s in stamps]
    first = next(i for i, s in enumerate(said) if s.startswith("step 1/2"))
    times = [0.0] + [t for t, _ in stamps[: first + 1]]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert stamps[0][0] < 5.0, stamps[:3]
    assert max(gaps[1:]) < 10.0, stamps[: first + 1]
    assert any(s.startswith("warm-up step 20/20") for s in said)  # in the driver, shown
    entries = [p.name for p in (tmp_path / "cache" / "warmup").iterdir() if p.is_dir()]
    assert len(entries) == 1 and ".tmp" not in entries[0], entries  # once, not per rank
    for wanted in ("held-out greedy accuracy before RL:", "held-out greedy accuracy after RL:"):
        assert any(s.startswith(wanted) for s in said), wanted
    assert any(s.startswith("checkpoint step 2: ") for s in said)
    folder = (tmp_path / "runs" / "latest").resolve()
    cfg = RunConfig.from_yaml(str(folder / "config.yaml"))
    assert cfg.runtime.run_id == folder.name and (tmp_path / "ck" / folder.name).is_dir()
    for name in ("metrics.jsonl", "timeline.json", "compiled_step.yaml", "tb"):
        assert (folder / name).exists(), name
    cal = subprocess.run(
        cmd + ["calibrate", str(tmp_path / "runs" / "latest"), "--out", str(tmp_path / "c.yaml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert cal.returncode == 0, cal.stderr[-2000:]
    assert (tmp_path / "c.yaml").exists()
