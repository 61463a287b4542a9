"""predict(): structure of the result, memory, infeasibility, staleness, speed."""

import pytest

from rpeg import specs
from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.plan import InfeasiblePlan, colocated_plan, disaggregated_plan

WL = Workload(
    num_prompts=64,
    samples_per_prompt=32,
    mean_prompt_tokens=128,
    max_response_tokens=4096,
    mean_response_tokens=1000,
    train_minibatches=4,
)


def test_colocated_prediction_has_every_stage_timeline_and_throughput():
    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "dgx-h100", num_nodes=2, model="llama3.1-8b", pp=2)
    p = predict(g, plan, WL)
    assert set(p.stages) == {s.name for s in g.stages}
    assert (
        p.stages["generate"].time_s
        > p.stages["train_actor"].time_s
        > p.stages["ref_logprob"].time_s
        > 0
    )
    assert p.num_devices == 16
    assert p.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_step / p.step_s / 16)
    assert 0 < p.mfu < 0.6
    ends = [r.end_s for r in p.timeline]
    assert max(ends) == pytest.approx(p.step_s)
    starts = [r.start_s for r in p.timeline if r.kind != "offload"]
    assert starts == sorted(starts)  # colocated: one after another
    assert 30 < p.step_s < 300


def test_memory_breakdown_of_a_known_configuration():
    g = builders.build("grpo", use_reference=False)
    plan = disaggregated_plan(
        g, "dgx-h100", num_nodes=2, gen_devices=8, train_devices=8, model="llama3.1-8b"
    )
    n = specs.model("llama3.1-8b").params

    def train_memory(engine):
        units = dict(plan.units)
        units["train_actor"] = units["train_actor"].model_copy(update={"engine": engine})
        p = predict(g, plan.model_copy(update={"units": units}), WL, check_memory=False)
        return p.stages["train_actor"].memory_gb

    # engine auto on 8 GPUs runs FSDP (rpeg.plan.schema.trains_fsdp): bf16 weights and
    # gradients, fp32 master + Adam m, v (12 B), all sharded over dp = 8
    mem = train_memory("auto")
    assert mem["weights"] == pytest.approx(n * 2 / 8 / 1e9)
    assert mem["gradients"] == pytest.approx(n * 2 / 8 / 1e9)
    assert mem["optimizer"] == pytest.approx(n * 12 / 8 / 1e9)
    assert train_memory("fsdp") == mem
    # replicas (engine torch): each of the 8 ranks holds all of it
    mem = train_memory("torch")
    assert (mem["weights"], mem["gradients"]) == pytest.approx((n * 2 / 1e9, n * 2 / 1e9))
    assert mem["optimizer"] == pytest.approx(n * 12 / 1e9)
    # Megatron's distributed optimizer: whole weights and gradients, the optimizer sharded
    mem = train_memory("megatron")
    assert mem["weights"] == pytest.approx(n * 2 / 1e9)
    assert mem["optimizer"] == pytest.approx(n * 12 / 8 / 1e9)


def test_staleness_overlaps_pools_and_partial_rollout_removes_the_tail():
    g0 = builders.build("grpo", use_reference=True, staleness=0)
    g1 = builders.build("grpo", use_reference=True, staleness=1)
    kw = dict(num_nodes=2, gen_devices=8, train_devices=8, model="llama3.1-8b")
    sync = predict(g0, disaggregated_plan(g0, "dgx-h100", **kw), WL)
    async_ = predict(g1, disaggregated_plan(g1, "dgx-h100", partial_rollout=False, **kw), WL)
    partial = predict(g1, disaggregated_plan(g1, "dgx-h100", partial_rollout=True, **kw), WL)
    assert async_.step_s < sync.step_s
    assert partial.step_s <= async_.step_s
    assert partial.stages["generate"].time_s < async_.stages["generate"].time_s


def test_partial_rollout_re_prefills_the_interrupted_sequences():
    """Every step's weight update interrupts the live sequences; resuming re-prefills prompt +
    partial response (the KV cache was computed with the old weights). Hand-worked: b live
    sequences of context c cost the forward FLOPs 2 N b c + L (d_qk + d_v) b c^2 per replica
    (tp = 1 here), at the GPU's matmul efficiency for the prefill GEMM x train_eff_factor;
    a rollout without partial rollout decodes to the end and re-prefills nothing."""
    from rpeg.perf.calibration import SHIPPED

    g1 = builders.build("grpo", use_reference=True, staleness=1)
    kw = dict(num_nodes=2, gen_devices=8, train_devices=8, model="llama3.1-8b")
    partial = predict(g1, disaggregated_plan(g1, "dgx-h100", partial_rollout=True, **kw), WL)
    d = partial.stages["generate"].detail
    m, gpu = specs.model("llama3.1-8b"), specs.gpu("h100-sxm")
    b, c = d["batch"], d["live_context"]
    assert WL.mean_prompt_tokens < c < WL.mean_prompt_tokens + WL.max_response_tokens
    flops = 2 * m.matmul_params * b * c + m.layers * (m.attn_width + m.v_width) * b * c * c
    gemm = 2.0 * 8192 * m.hidden * max(m.ffn_hidden, m.attn_width)  # b * c > 8192 tokens
    rate = gpu.bf16_dense_tflops * 1e12 * gpu.matmul_eff(gemm) * SHIPPED.train_eff_factor
    assert d["reprefill_s"] == pytest.approx(flops / rate, rel=1e-6)
    assert 0 < d["reprefill_s"] < 0.5 * partial.stages["generate"].time_s
    async_ = predict(g1, disaggregated_plan(g1, "dgx-h100", partial_rollout=False, **kw), WL)
    assert "reprefill_s" not in async_.stages["generate"].detail


def test_infeasible_memory_carries_numbers():
    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "dgx-h100", num_nodes=1, model="deepseek-v3")
    with pytest.raises(InfeasiblePlan) as info:
        predict(g, plan, WL)
    e = info.value
    assert e.reason == "memory" and e.needed_gb > e.capacity_gb and e.unit


def test_infeasible_devices_and_divisibility():
    g = builders.build("grpo", use_reference=False)
    plan = colocated_plan(g, "dgx-h100", num_devices=16, model="llama3.1-8b")
    with pytest.raises(InfeasiblePlan) as info:
        predict(g, plan, WL, cluster=specs.cluster("dgx-h100", num_nodes=1))
    assert info.value.reason == "devices"
    with pytest.raises(ValueError, match="must divide"):
        colocated_plan(g, "dgx-h100", num_devices=8, tp=3)


def test_tiny_model_on_local_cpu_is_feasible():
    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "local-cpu", model="rpeg-tiny")
    wl = Workload(
        num_prompts=16,
        samples_per_prompt=8,
        mean_prompt_tokens=32,
        max_response_tokens=16,
        precision="fp32",
        train_minibatches=1,
    )
    p = predict(g, plan, wl)
    assert p.step_s > 0 and p.num_devices == 2


def _fsdp_train(model: str, setting):
    """A disaggregated GRPO plan whose 8 trainer GPUs run FSDP (dp 8) with the given
    ``reshard_after_forward``."""
    g = builders.build("grpo", use_reference=False)
    plan = disaggregated_plan(
        g, "dgx-h100", num_nodes=2, gen_devices=8, train_devices=8, model=model
    )
    units = {
        n: (
            u.model_copy(update={"engine": "fsdp", "reshard_after_forward": setting})
            if n == "train_actor"
            else u
        )
        for n, u in plan.units.items()
    }
    return g, plan.model_copy(update={"units": units})


@pytest.mark.parametrize(
    ("model", "setting", "gathered"),
    [
        # auto: the extra is params * 2 B * (1 - 1/8) against 10% of an H100's 85.5 GB
        ("qwen2.5-1.5b-instruct", "auto", True),  # 1.54e9 * 2 * 7/8 = 2.7 GB
        ("llama3.1-8b", "auto", False),  # 8.03e9 * 2 * 7/8 = 14.1 GB
        ("llama3.1-8b", False, True),  # asked for: priced (and memory-checked) as asked
        ("qwen2.5-1.5b-instruct", True, False),
    ],
)
def test_fsdp_parameters_kept_gathered_cost_memory_and_save_a_gather(model, setting, gathered):
    g, plan = _fsdp_train(model, setting)
    st = predict(g, plan, WL).stages["train_actor"]
    n = specs.model(model).params
    if gathered:
        assert st.memory_gb["gathered_weights"] == pytest.approx(n * 2 * 7 / 8 / 1e9)
        assert st.detail["fsdp_collectives_per_micro_batch"] == 2
    else:
        assert "gathered_weights" not in st.memory_gb
        assert st.detail["fsdp_collectives_per_micro_batch"] == 3
    assert st.memory_gb["weights"] == pytest.approx(n * 2 / 8 / 1e9)
