"""Issue 41 item 3 on Prefect + Dask: `rpeg train` (not --local) with task.val_url and
runtime.val_every writes val/<metric> per data source into the validated steps' lines and
TensorBoard (step 0 = before RL), and says so on the console."""

import json
import os
import subprocess
import sys

import pytest

from tests.firstday.conftest import run_yaml
from tests.firstday.test_validation import write_val_jsonl


@pytest.mark.slow
def test_distributed_run_validates_every_n_steps(user_files, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = run_yaml(user_files, tmp_path)
    val = write_val_jsonl(tmp_path / "val.jsonl")
    env = dict(os.environ, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    args = [cfg, "--steps", "3", f"task.val_url={val}", "runtime.val_every=2"]
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from rpeg.cli import main; sys.exit(main())"]
        + ["train", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "validation: 6 prompts from val.jsonl" in out
    assert "validation after step 2: accuracy" in out and "lighteval/MATH" in out
    (metrics,) = (tmp_path / "out").rglob("metrics.jsonl")  # the run's folder, or out/ itself
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert ["val/accuracy" in m for m in lines] == [False, True, True]
    assert {"val/openai/gsm8k/accuracy", "val/lighteval/MATH/reward"} <= set(lines[1])
    assert lines[2]["val/prompts"] == 6
    events = EventAccumulator(str(metrics.parent / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("val/accuracy")] == [0, 2, 3]
