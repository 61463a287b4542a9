"""Every tiny architecture of tests/runtime/models/tiny_folders.py on Prefect + Dask, dp=2 with
FSDP2 over the model's own decoder-layer classes (issue 40 item 1): 2 steps, an HF export per
checkpoint that transformers reloads, trained away from the folder's weights. One cluster for
all (conftest.py)."""

from __future__ import annotations

import pytest
import torch

from rpeg.config import RunConfig
from tests.runtime.models.tiny_folders import MODEL_TYPES, write_tiny_folder

pytestmark = pytest.mark.slow

IDS = torch.tensor([[1, 40, 41, 17, 42, 2, 5, 9]])


def fsdp_dp2_config(folder, out) -> RunConfig:
    devices = "0-1"
    units = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "sync_weights")
    plan = {u: {"devices": devices} for u in units}
    plan["train_actor"] = {"devices": devices, "engine": "fsdp"}
    return RunConfig.from_dict(
        {
            "model": {"path": str(folder)},
            "algorithm": {"name": "grpo", "entropy_coef": 0.05},
            "task": {"kind": "arithmetic", "heldout_size": 2},
            "workload": {
                "num_prompts": 2,
                "samples_per_prompt": 2,
                "max_response_tokens": 4,
                "train_minibatches": 1,
            },
            "cluster": {"name": "local-cpu", "n_workers": 2, "num_devices": 2},
            "plan": {"cluster": "local-cpu", "graph": {"builder": None}, "units": plan},
            "runtime": {
                "steps": 2,
                "output_dir": str(out / "out"),
                "checkpoint_url": str(out / "ckpt"),
                "checkpoint_every": 2,
                "export_hf": True,
            },
        }
    )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_trains_two_steps_on_dask_dp2_fsdp_and_exports(
    model_type, tmp_path, prefect_harness, dask_cluster
):
    from rpeg.flows.entry import train_on
    from transformers import AutoModelForCausalLM

    folder = write_tiny_folder(model_type, tmp_path / "model")
    cfg = fsdp_dp2_config(folder, tmp_path)
    s = train_on(dask_cluster, cfg, progress=False)
    assert s["steps"] == 2
    (group,) = s["layout"]
    assert s["layout"][group]["dp"] == 2 and s["layout"][group]["fsdp"]
    out = tmp_path / "out" / "hf" / "step-00000002"
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=False).eval()
    start = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=False).eval()
    assert type(hf) is type(start)
    with torch.no_grad():
        after, before = hf(input_ids=IDS).logits, start(input_ids=IDS).logits
    assert torch.isfinite(after).all()
    assert not torch.allclose(before, after)  # trained on both ranks, gathered, exported
