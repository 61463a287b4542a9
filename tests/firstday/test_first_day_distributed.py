"""The issue's first day end to end on both runtimes: `rpeg train cfg.yaml --steps 3` on a
tiny Qwen2-style model with a chat template and verl's Parquet (or TRL's conversational
JSONL), `--local` and Prefect + Dask; samples.jsonl written with the template applied;
`rpeg export` of the last checkpoint loads in transformers with the trained weights."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.firstday.conftest import run_yaml


def _rpeg(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    return subprocess.run(
        [sys.executable, "-c", "import sys; from rpeg.cli import main; sys.exit(main())", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _logits(folder: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 70, 71, 72, 2, 5, 9, 201, 1]])).logits


@pytest.mark.slow
@pytest.mark.parametrize("data", ["verl", "trl"])
def test_first_day_both_runtimes(user_files, tmp_path, data):
    rewards, logits = {}, {}
    for runtime in ("local", "distributed"):
        d = tmp_path / runtime
        d.mkdir()
        cfg = run_yaml(user_files, d, data=data)
        args = ["train", cfg, "--steps", "3"] + (["--local"] if runtime == "local" else [])
        res = _rpeg(*args, cwd=d)
        log = res.stdout + res.stderr
        assert res.returncode == 0, log[-4000:]
        assert "chat template applied" in log
        assert "done: 3 steps" in log
        # stdout is a pipe here: one line per step on both runtimes (the same helper)
        assert [f"step {i}/3: reward" in log for i in (1, 2, 3)] == [True] * 3
        if runtime == "distributed":
            assert "start-up: LocalCluster up in" in log  # the start-up phases, as they happen
            assert "start-up: actors ready" in log
        rows = [
            json.loads(x) for x in (d / "out" / "latest" / "samples.jsonl").read_text().splitlines()
        ]
        assert sorted({r["step"] for r in rows}) == [1, 2, 3] and len(rows) == 12
        assert all(r["prompt"].startswith("<|im_start|>user\n") for r in rows)
        assert all(r["prompt"].endswith("<|im_start|>assistant\n") for r in rows)
        assert all("<|im_" not in r["response"] for r in rows)
        rewards[runtime] = [(r["step"], r["index"], r["response"], r["reward"]) for r in rows]
        ex = _rpeg("export", str(d / "ckpt"), "--out", str(d / "hf"), "--config", cfg, cwd=d)
        assert ex.returncode == 0, ex.stdout + ex.stderr
        logits[runtime] = _logits(str(d / "hf"))
    # the same samples, step for step, and the same trained weights on both runtimes
    assert rewards["local"] == rewards["distributed"]
    torch.testing.assert_close(logits["local"], logits["distributed"], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(logits["local"], _logits(user_files["model"]))  # trained
