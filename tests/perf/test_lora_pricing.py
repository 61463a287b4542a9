"""The performance model prices a LoRA run (model.lora; rpeg.perf.lora): adapter parameters
counted by hand, the trainer's gradients and optimizer state of the adapters only, and the
adapters' own weights beside the frozen base."""

import pytest

from rpeg.config import RunConfig
from rpeg.perf import Workload, predict_plan
from rpeg.perf.lora import lora_params
from rpeg.specs.hf import priced_model


def test_adapter_params_by_hand():
    """rpeg-tiny: 4 layers, hidden 256, 4 heads x 64 (q, k, v, o all 256 x 256), MLP 1024.
    Rank 8 on q_proj, v_proj: 8 * (256 + 256) = 4,096 per module, 2 per layer, 4 layers ->
    32,768 (what peft adds to the real model: tests/runtime/test_lora.py counts it there).
    Rank 2 on up_proj (256 -> 1024) and down_proj (1024 -> 256): 2 * 1280 * 2 * 4 = 20,480."""
    m = priced_model(RunConfig().model)
    assert lora_params(m, 8, ("q_proj", "v_proj")) == 32768
    assert lora_params(m, 2, ("up_proj", "down_proj")) == 20480
    assert lora_params(m, 8, ("no_such",)) == 0


def _train_memory(cfg: RunConfig) -> dict[str, float]:
    from rpeg.compile import resolve

    _, plan = resolve(None, cfg)
    wl = Workload.from_config(cfg.workload, cfg.model.lora)
    pred = predict_plan(plan, wl, algorithm=cfg.algorithm, model=priced_model(cfg.model))
    (mem,) = [s.memory_gb for s in pred.stages.values() if "optimizer" in s.memory_gb]
    return mem


def test_lora_trainer_holds_adapter_state_only():
    base = RunConfig()
    lora = RunConfig.from_yaml("model: {lora: {rank: 8}}")
    m = priced_model(base.model)
    full, lo = _train_memory(base), _train_memory(lora)
    share = 32768 / m.params  # the adapters' share of the parameters
    assert lo["optimizer"] == pytest.approx(full["optimizer"] * share)
    assert lo["gradients"] == pytest.approx(full["gradients"] * share)
    assert lo["weights"] == pytest.approx(full["weights"])  # the frozen base stays whole
    # the adapters' own weights: 32,768 x the weights' bytes per parameter
    assert lo["lora_adapters"] == pytest.approx(full["weights"] * share)
    assert "lora_adapters" not in full
