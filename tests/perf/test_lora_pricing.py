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


def test_replicated_factors_by_hand():
    """Under tp the factor on the unsplit side stays whole (rpeg.runtime.lora_tp): A (r x in)
    of column-wise q/k/v/gate/up, B (out x r) of row-wise o/down. rpeg-tiny, rank 8 on q and
    v (column-wise, in 256): 8 * 256 * 2 * 4 layers = 16,384; rank 2 on o (out 256) and down
    (out 256): 2 * 256 * 2 * 4 = 4,096."""
    from rpeg.perf.lora import COLUMN_WISE, replicated_lora_params
    from rpeg.runtime.model_io.architectures import TP_PLAN

    m = priced_model(RunConfig().model)
    assert replicated_lora_params(m, 8, ("q_proj", "v_proj")) == 16384
    assert replicated_lora_params(m, 2, ("o_proj", "down_proj")) == 4096
    # the pure layer's split kinds are the runtime's
    assert set(COLUMN_WISE) == {k.rsplit(".", 1)[1] for k, v in TP_PLAN.items() if v == "colwise"}


def _tp2_train_stage(lora: str):
    from pathlib import Path

    from rpeg.compile import resolve

    root = Path(__file__).resolve().parents[2] / "configs"
    cfg = RunConfig.from_yaml(root / "tp2-cpu.yaml")
    if lora:
        cfg = cfg.with_overrides({"model.lora": {"rank": 8}})
    _, plan = resolve(None, cfg)
    assert plan.units["train_actor"].tp == 2
    wl = Workload.from_config(cfg.workload, cfg.model.lora)
    pred = predict_plan(plan, wl, algorithm=cfg.algorithm, model=priced_model(cfg.model))
    (stage,) = [s for s in pred.stages.values() if "optimizer" in s.memory_gb]
    return cfg, plan, wl, stage


def test_lora_at_tp2_holds_the_replicated_factor_whole_and_sums_its_gradient_once():
    """rpeg-tiny at tp=2, rank 8 on q, v: a rank holds B split (8 * 256 / 2 per module) and A
    whole (8 * 256): (1,024 + 2,048) * 2 modules * 4 layers = 24,576 adapter parameters, not
    32,768 / 2 = 16,384; its optimizer, gradients and adapter weights price those. Once per
    optimizer step it all-reduces the replicated A's gradients over tp: 16,384 x 2 B =
    32,768 B (the trainer's gradients are priced in bf16)."""
    from rpeg import specs
    from rpeg.perf import costs
    from rpeg.perf.calibration import DEFAULT
    from rpeg.perf.units import params_per_device

    _, _, _, full = _tp2_train_stage("")
    cfg, plan, wl, lo = _tp2_train_stage("lora")
    m = priced_model(cfg.model)
    p_dev = params_per_device(m, 2, 1, 1)
    assert lo.memory_gb["optimizer"] == pytest.approx(full.memory_gb["optimizer"] * 24576 / p_dev)
    assert lo.memory_gb["gradients"] == pytest.approx(full.memory_gb["gradients"] * 24576 / p_dev)
    assert lo.memory_gb["lora_adapters"] == pytest.approx(full.memory_gb["weights"] * 24576 / p_dev)
    cluster = specs.cluster(plan.cluster, num_devices=2)
    lvl, bw, alpha = costs.group_link(cluster, plan.units["train_actor"].devices[0], 2)
    eff = DEFAULT.nccl_bus_eff
    # ring all-reduce of 32,768 B over 2 ranks: 2 (1/2) n / (bw eff) + 2 log2(2) alpha
    one = 32768 / (bw * eff) + 2 * alpha
    assert lo.detail["lora_tp_grad_sum_s"] == pytest.approx(wl.train_minibatches * one)
    assert "lora_tp_grad_sum_s" not in full.detail
    assert lo.comm_s[lvl] - full.comm_s[lvl] == pytest.approx(wl.train_minibatches * one)


def test_lora_backward_skips_the_frozen_weights_gradients():
    """A frozen base layer's backward computes the input gradient and no weight gradient:
    its GEMMs run forward + one backward, 2 passes of full fine-tuning's 3 (3 of 4 with the
    layers recomputed); attention, which holds no weights, keeps its whole backward."""
    from dataclasses import replace

    from rpeg import specs
    from rpeg.ir import builders
    from rpeg.perf import passes
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.units import UnitContext
    from rpeg.plan import colocated_plan

    wl = Workload(
        num_prompts=16,
        samples_per_prompt=8,
        mean_prompt_tokens=512,
        max_response_tokens=2048,
        mean_response_tokens=1024,
        train_minibatches=4,
    )
    plan = colocated_plan(builders.build("grpo"), "dgx-h100", num_devices=8, model="qwen2.5-7b")
    u = plan.units["train_actor"]
    m = specs.model("qwen2.5-7b")

    def gemms(w, unit):
        c = UnitContext(plan, w, specs.cluster("dgx-h100"), m, SHIPPED)
        return passes.gemm_compute(c, passes.pass_shape(c, unit, True))

    lora = replace(wl, lora_rank=16, lora_targets=("q_proj", "v_proj"))
    for recompute, share in ((False, 2 / 3), (True, 3 / 4)):
        unit = u.model_copy(update={"recompute": recompute})
        full, lo = gemms(wl, unit), gemms(lora, unit)
        assert lo.dense_s == pytest.approx(full.dense_s * share)
        assert lo.attention_s == pytest.approx(full.attention_s)
