"""``rpeg train CONFIG --steps 2`` with ``runtime.engine: vllm`` on a tiny Hugging Face model
the test writes: single-process (``--local``) and distributed (Prefect + Dask, two ranks,
each with its own vLLM engine colocated with its trainer). Weights reach vLLM every step
(``weight_sync_bytes`` > 0 in the summary), the rollout/trainer log-prob mismatch is recorded,
and no vLLM process or /dev/shm segment outlives the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cpu_plans import all_units_on
from leaks import settle, shm_segments, vllm_processes

pytestmark = pytest.mark.slow

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
)
UNITS = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "train_actor")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rpeg.runtime.model_io import create_tiny

    path = tmp_path_factory.mktemp("tiny-hf")
    model, tok = create_tiny(seed=0, **SHAPE)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _config(tmp_path: Path, model_dir: Path, *, ranks: int, fsdp: bool = False) -> Path:
    cfg = {
        "model": {"name": "rpeg-tiny", "path": str(model_dir)},
        "algorithm": {"name": "grpo"},
        "task": {"kind": "arithmetic"},
        "workload": {
            "num_prompts": 2,
            "samples_per_prompt": 2,
            "max_response_tokens": 8,
            "train_minibatches": 1,
        },
        "optim": {"warmup_sft_steps": 0},
        "runtime": {"engine": "vllm", "output_dir": str(tmp_path / "out")},
    }
    if ranks > 1:
        cfg |= all_units_on((*UNITS, "sync_weights"), ranks)
    if fsdp:
        cfg["plan"]["units"]["train_actor"]["engine"] = "fsdp"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(tmp_path: Path, config: Path, *extra: str) -> dict:
    rpeg = Path(sys.executable).parent / "rpeg"  # this environment's console script
    summary = tmp_path / "summary.json"
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
    )
    env.pop("PREFECT_API_URL", None)
    shm0, procs0 = shm_segments(), vllm_processes()
    run = subprocess.run(
        [str(rpeg), "train", str(config), "--steps", "2", "--summary-json", str(summary), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not settle(lambda: vllm_processes() - procs0), "a vLLM process outlived the run"
    assert not settle(lambda: shm_segments() - shm0), "a /dev/shm segment outlived the run"
    return json.loads(summary.read_text())


def _check(out: dict, tmp_path: Path) -> None:
    assert out["steps"] == 2
    assert out["weight_sync_bytes"] > 0  # every step's update reached the engine
    # the rollout/trainer log-prob mismatch, in the summary (issue 25's "done when") and on
    # every step: the engine's log-probs are reused as the old ones (fp32, processed
    # log-probs), so the first update's forward measures them (rollout_correction.measure)
    assert {"logprob_mismatch_mean", "logprob_mismatch_k3"} <= set(out), sorted(out)
    assert 0 <= out["logprob_mismatch_mean"] < 1e-4
    rows = [
        json.loads(x)
        for x in (tmp_path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["weight_sync_bytes"] > 0
        # fp32 engine, processed log-probs: the rollout's log-probs are the trainer's
        assert 0 <= r["logprob_mismatch_mean"] < 1e-4


def test_train_local_with_vllm(tmp_path, model_dir):
    _check(_train(tmp_path, _config(tmp_path, model_dir, ranks=1), "--local"), tmp_path)


def test_train_distributed_two_ranks_with_vllm(tmp_path, model_dir):
    out = _train(tmp_path, _config(tmp_path, model_dir, ranks=2))
    _check(out, tmp_path)


def test_train_fsdp_two_ranks_builds_vllm_from_the_shards(tmp_path, model_dir):
    """FSDP over two ranks with a colocated vLLM each: the roles are built on the meta device
    and filled shard by shard, and each rank's engine gets its weights from the laid-out
    actor bucket by bucket (no rank holds a whole fp32 copy or writes a weights folder);
    log-probs still match the trainer's."""
    out = _train(tmp_path, _config(tmp_path, model_dir, ranks=2, fsdp=True))
    _check(out, tmp_path)
    held = [b for ranks in out["param_bytes_per_rank"].values() for b in ranks]
    assert len(held) == 2 and max(held) < out["full_param_bytes"], out["param_bytes_per_rank"]
