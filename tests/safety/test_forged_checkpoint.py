"""Issue 44, item 7: a checkpoint part holding another model's weights under a forged (matching)
checksum is named and the previous checkpoint is loaded, instead of exit 1 with a state_dict
traceback."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.runtime.actors.checkpoint import COMMIT, CheckpointError, dumps, loads


def _cfg(tmp_path, **over):
    base = {
        "workload.num_prompts": 2,
        "workload.samples_per_prompt": 2,
        "workload.max_response_tokens": 4,
        "workload.micro_batch_size": 4,
        "workload.train_minibatches": 1,
        "task.heldout_size": 4,
        "model.tiny_shape": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
        "optim.warmup_sft_steps": 0,
        "runtime.steps": 2,
        "runtime.checkpoint_every": 1,
        "runtime.val_before_train": False,
        "runtime.checkpoint_url": str(tmp_path / "ck"),
        "runtime.output_dir": str(tmp_path / "out"),
        "runtime.run_id": "run-f",
    }
    return RunConfig().with_overrides({**base, **over})


def _forge(step_dir):
    """Put another model's weights (other shapes) into trainer.pt and fix the checksum."""
    part = step_dir / "trainer.pt"
    state = loads(part.read_bytes())
    module = state["trainer"]["actor"]["module"]
    for k in list(module)[:3]:
        module[k] = torch.zeros(7, 5)
    data = dumps(state)
    part.write_bytes(data)
    commit = json.loads((step_dir / COMMIT).read_text())
    commit["files"]["trainer.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (step_dir / COMMIT).write_text(json.dumps(commit))


def test_a_forged_part_is_named_and_the_previous_checkpoint_loaded(tmp_path):
    from rpeg.runtime.local_trainer import LocalTrainer

    LocalTrainer(_cfg(tmp_path)).run()  # checkpoints after steps 1 and 2
    _forge(tmp_path / "ck" / "run-f" / "step-00000002")
    lines: list[str] = []
    resumed = LocalTrainer(
        _cfg(tmp_path, **{"runtime.resume": True, "runtime.steps": 3}), log=lines.append
    )
    resumed.run()
    said = "\n".join(lines)
    assert "step-00000002/trainer.pt does not load" in said
    assert "falling back to checkpoint step 1" in said
    assert "does not fit this run's actor" in said
    assert resumed.step_index == 3  # steps 2-3 trained from step 1's state


def test_with_nothing_to_fall_back_to_the_error_names_the_file(tmp_path):
    from rpeg.runtime.local_trainer import LocalTrainer

    LocalTrainer(_cfg(tmp_path, **{"runtime.steps": 1})).run()
    _forge(tmp_path / "ck" / "run-f" / "step-00000001")
    with pytest.raises(CheckpointError, match="step-00000001/trainer.pt.*does not fit"):
        LocalTrainer(_cfg(tmp_path, **{"runtime.resume": True})).run()
