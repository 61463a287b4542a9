"""Issue 31 item 5: `rpeg export` of a real 2-rank sharded run's checkpoint. One step of a
LoRA run at tp=2 and one of a full-weights run at FSDP dp=2, each checkpointed (the group's
ranks write torch.distributed.checkpoint shards), exported in this one process, loaded with
transformers; the logits equal those of the run's own policy -- the weights its rank 0
gathers for weight sync (merged W + s B @ A for LoRA), put into the built-in model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
IDS = torch.tensor([[1, 10, 11, 12, 13, 14, 15], [1, 5, 9, 14, 2, 7, 3]])
#: fp32 on both sides. Measured (2026-12-03 07:39 UTC): the exported logits equal the run's
#: bit for bit (LoRA merged and FSDP full), peft's unmerged adapter over the base within
#: 2.1e-7, on logits up to ~1.2; one step moved them by 0.27 (LoRA) and 0.38 (FSDP)
TOL = 1e-5


def _config(tmp_path, units, **over):
    from tests.runtime.actors.conftest import tiny_config

    plan = {
        "cluster": "local-cpu",
        "model": "rpeg-tiny",
        "graph": {"builder": None},
        "staleness": 0,
        "units": units,
    }
    cfg = tiny_config(
        tmp_path,
        **{
            "cluster.num_devices": 2,
            "cluster.n_workers": 2,
            "optim.warmup_sft_steps": 0,
            "runtime.checkpoint_url": str(tmp_path / "ck"),
            "runtime.checkpoint_every": 1,
            "runtime.run_id": "export-run",
        },
    )
    return cfg.with_overrides({"plan": plan, "model.tiny_shape": SMALL, **over})


def _one_step(cfg, cluster) -> dict[str, torch.Tensor]:
    """Run one step, checkpoint it; the policy's full weights as weight sync sends them."""
    from rpeg.compile import compile_plan
    from rpeg.runtime.actors.driver import DistributedRun
    from rpeg.runtime.actors.weight_sync import unpack

    compiled = compile_plan(None, cfg)
    run = DistributedRun(cfg, compiled, cluster)
    try:
        run.start_actors()
        for t in compiled.tasks:
            run.run_unit(0, t.name)
        run.release(0)
        got = run.group(compiled.trainer_group)._all(lambda r, a: a.get_weight_buckets(1 << 26))
        run.checkpoint(1, {})
    finally:
        run.close()
    return unpack(got[0][0])


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def _own(weights) -> torch.Tensor:
    from rpeg.runtime.model_io import create_tiny

    model, _ = create_tiny(seed=0, **SMALL)
    model.load_state_dict(weights, strict=True)
    return _logits(model)


def _exported(out) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    return _logits(AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=False))


def _shards(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "ck").rglob("*.dcp"))


def test_a_tp2_lora_run_exports_the_adapter_and_the_merged_model(tmp_path, dask_cluster):
    from peft import PeftModel

    from rpeg.cli import main
    from rpeg.runtime.role_builder import build_policy

    tp2 = {"devices": "0-1", "tp": 2}
    units = {u: tp2 for u in ("generate", "ref_logprob", "old_logprob", "advantage")}
    units |= {"reward": {"devices": "0-1"}, "train_actor": tp2, "sync_weights": tp2}
    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]}
    # lr 1e-2: one Adam step moves every B element by ~1e-2 (the entropy bonus gives a
    # gradient even when the 4 rewards tie), so the merged model is far from the base
    cfg = _config(tmp_path, units, **{"model.lora": lora, "optim.lr": 1e-2})
    own = _one_step(cfg, dask_cluster)
    assert len(_shards(tmp_path)) == 1  # the trainer group's shards
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(cfg.to_yaml())
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "ck"), "--out", str(out), "--config", str(run_yaml)]) == 0
    want = _own(own)
    got = _exported(out)
    assert (got - want).abs().max() < TOL
    base, _, _ = build_policy(cfg)
    assert (_logits(base) - want).abs().max() > 100 * TOL  # the adapters trained
    peft_model = PeftModel.from_pretrained(base, str(out / "adapter"))
    assert (_logits(peft_model) - want).abs().max() < TOL


def test_an_fsdp_dp2_run_exports_the_full_model(tmp_path, dask_cluster):
    from rpeg.runtime.export import export_checkpoint
    from rpeg.runtime.role_builder import build_policy

    units = {
        u: {"devices": "0-1"}
        for u in ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "sync_weights")
    }
    units["train_actor"] = {"devices": "0-1", "engine": "fsdp"}
    # runtime.export_hf: the driver also exports the shards at the checkpoint
    cfg = _config(tmp_path, units, **{"optim.lr": 1e-3, "runtime.export_hf": True})
    own = _one_step(cfg, dask_cluster)
    assert len(_shards(tmp_path)) == 1
    out = tmp_path / "hf"
    export_checkpoint(str(tmp_path / "ck"), str(out))  # the tiny model's shape: the marker's
    want = _own(own)
    assert (_exported(out) - want).abs().max() < TOL
    assert (_exported(tmp_path / "out" / "hf" / "step-00000001") - want).abs().max() < TOL
    start, _, _ = build_policy(cfg)  # the run's initial weights
    assert (_logits(start) - want).abs().max() > 100 * TOL  # the step moved them
