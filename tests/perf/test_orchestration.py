"""Dispatch, hand-off, streaming overlap, the shared value head and single-unit pricing."""

import dataclasses

import pytest

from rpeg import specs
from rpeg.ir import builders, fuse, share_actor_critic, to_dict
from rpeg.perf import DEFAULT, Workload, predict, price_unit
from rpeg.perf.units import field_bytes
from rpeg.plan import colocated_plan, disaggregated_plan

WL = Workload(
    num_prompts=64,
    samples_per_prompt=32,
    mean_prompt_tokens=128,
    max_response_tokens=4096,
    mean_response_tokens=1000,
    train_minibatches=4,
)
KW = dict(num_nodes=2, model="llama3.1-8b")


def _inline(plan, g):
    return plan.with_inline_graph(to_dict(g))


def test_every_unit_pays_one_dispatch():
    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "dgx-h100", **KW)
    cal = dataclasses.replace(DEFAULT, dispatch_s=0.5)
    base = predict(g, plan, WL)
    more = predict(g, plan, WL, calib=cal)
    n_units = len(base.stages)
    for name in base.stages:
        assert more.stages[name].time_s - base.stages[name].time_s == pytest.approx(
            0.5 - DEFAULT.dispatch_s
        )
    # colocated: the units run one after another, so the step pays every dispatch
    assert more.step_s - base.step_s == pytest.approx(n_units * (0.5 - DEFAULT.dispatch_s))


def test_handoff_across_pools_is_bytes_over_the_link_plus_latency():
    g = builders.build("grpo", use_reference=False)
    plan = disaggregated_plan(g, "dgx-h100", gen_devices=8, train_devices=8, **KW)
    p = predict(g, plan, WL)
    cl = specs.cluster("dgx-h100", num_nodes=2)
    # old_logprob (training pool) reads responses + response_mask from generate (gen pool)
    sc = p.stages["old_logprob"]
    n, prompt = 64 * 32, 128.0
    mean_r = 1000.0  # mean response length is given, so the length distribution keeps it
    expected_bytes = n * (prompt + mean_r) * 8 + n * (prompt + mean_r) * 1
    assert sc.detail["handoff_bytes"] == pytest.approx(expected_bytes, rel=1e-3)
    bw = cl.link(cl.span_level_contiguous(0, 16)).bytes_per_s
    assert sc.detail["handoff_s"] == pytest.approx(
        expected_bytes / bw + DEFAULT.handoff_latency_s, rel=1e-3
    )
    # the reward on the generation devices reads from generate: same processes, no hand-off
    assert "handoff_s" not in p.stages["reward"].detail


def test_field_bytes_hand_worked():
    from rpeg.perf.units import UnitContext

    g = builders.build("grpo")
    plan = colocated_plan(g, "dgx-h100", **KW)
    c = UnitContext(
        plan, WL, specs.cluster("dgx-h100", num_nodes=2), specs.model("llama3.1-8b"), DEFAULT
    )
    n = 2048
    assert field_bytes(c, "rewards") == n * 4
    assert field_bytes(c, "old_logprobs") == pytest.approx(n * c.R * 4)
    assert field_bytes(c, "responses") == pytest.approx(n * (128 + c.R) * 8)
    assert field_bytes(c, "actor_weights") == 0


def test_fusion_strictly_helps_when_dispatch_is_not_free():
    """Fused and unfused stages are otherwise equal: fusion saves one dispatch per unit."""
    g = builders.build("grpo", use_reference=True)
    gf = fuse(g, ["generate", "reward"], streaming=True, name="rollout")
    plan = colocated_plan(g, "dgx-h100", **KW)
    fplan = _inline(colocated_plan(gf, "dgx-h100", **KW), gf)
    for d in (0.001, 0.05):
        cal = dataclasses.replace(DEFAULT, dispatch_s=d, host_per_sample_s=0.0)
        a = predict(g, plan, WL, calib=cal).step_s
        b = predict(gf, fplan, WL, calib=cal).step_s
        assert b < a
        assert a - b == pytest.approx(d)  # rule reward: no work to overlap, one task less
    # with host work per sample the streamed reward also hides under the generation tail
    cal = dataclasses.replace(DEFAULT, dispatch_s=0.0, host_per_sample_s=0.001)
    a = predict(g, plan, WL, calib=cal)
    b = predict(gf, fplan, WL, calib=cal)
    reward_s = WL.samples * 0.001
    assert a.stages["reward"].time_s == pytest.approx(reward_s)
    assert 0 < a.step_s - b.step_s <= reward_s + 1e-9
    cal0 = dataclasses.replace(DEFAULT, dispatch_s=0.0, host_per_sample_s=0.0)
    assert predict(gf, fplan, WL, calib=cal0).step_s == pytest.approx(
        predict(g, plan, WL, calib=cal0).step_s
    )


def test_streaming_fusion_hides_the_consumer_under_the_generation_tail():
    g = builders.build("grpo", use_reference=False, reward="model")
    gf = fuse(g, ["generate", "reward"], streaming=True, name="rollout")
    plan = colocated_plan(g, "dgx-h100", **KW)
    fplan = _inline(colocated_plan(gf, "dgx-h100", **KW), gf)
    a = predict(g, plan, WL)
    b = predict(gf, fplan, WL)
    gen, rew = a.stages["generate"], a.stages["reward"]
    roll = b.stages["rollout"]
    overlap = roll.detail["stream_overlap_s"]
    seqs = gen.detail["seqs_per_replica"]
    consumer = rew.time_s - DEFAULT.dispatch_s
    assert overlap == pytest.approx(min(consumer * (1 - 1 / seqs), gen.detail["tail_s"]), rel=1e-6)
    assert overlap > 0
    assert roll.time_s == pytest.approx(gen.time_s + rew.time_s - DEFAULT.dispatch_s - overlap)
    assert b.step_s < a.step_s


def test_unshared_ppo_pays_a_full_critic_and_shared_only_the_head():
    g = builders.build("ppo", use_reference=True)
    gs = share_actor_critic(g)
    kw = dict(num_nodes=4, model="llama3.1-8b")
    plan = colocated_plan(g, "dgx-h100", **kw)
    splan = _inline(colocated_plan(gs, "dgx-h100", **kw), gs)
    full = predict(g, plan, WL)
    shared = predict(gs, splan, WL)
    assert shared.step_s < full.step_s
    # the separate critic: a forward (values) and an update (train_critic) of a full model
    assert full.stages["values"].time_s == pytest.approx(full.stages["ref_logprob"].time_s)
    assert full.stages["train_critic"].flops == pytest.approx(full.stages["train_actor"].flops)
    # shared: the head only (h -> 1 per token), forward in old_logprob, fwd+bwd in training
    m = specs.model("llama3.1-8b")
    tokens = full.tokens_per_step
    assert shared.stages["old_logprob"].flops - full.stages["old_logprob"].flops == pytest.approx(
        2 * m.hidden * tokens
    )
    assert shared.stages["train_actor"].flops - full.stages["train_actor"].flops == pytest.approx(
        6 * m.hidden * tokens
    )
    assert 0 < shared.stages["train_actor"].detail["value_head_s"] < 1e-3 * shared.step_s
    # offloaded pool: the separate critic's weights, grads and optimizer state move too
    crit = full.stages["train_critic"].memory_gb
    state = crit["weights"] + crit["gradients"] + crit["optimizer"]
    off = [r for r in full.timeline if r.kind == "offload"][0]
    soff = [r for r in shared.timeline if r.kind == "offload"][0]
    host = DEFAULT.host_link_gbps
    assert (off.end_s - off.start_s) - (soff.end_s - soff.start_s) == pytest.approx(
        4 * state / host, rel=0.01
    )

    # without offload: the separate critic keeps its weights + optimizer state resident
    def no_off(p):
        return p.model_copy(
            update={
                "units": {n: u.model_copy(update={"offload": False}) for n, u in p.units.items()}
            }
        )

    full = predict(g, no_off(plan), WL, check_memory=False)
    shared = predict(gs, no_off(splan), WL, check_memory=False)
    key = next(iter(full.device_memory_gb))
    assert full.device_memory_gb[key] - shared.device_memory_gb[key] == pytest.approx(
        crit["weights"] + crit["optimizer"], rel=0.01
    )


def test_price_unit_equals_the_stage_of_predict():
    g = builders.build("grpo", use_reference=True, staleness=1)
    plan = disaggregated_plan(g, "dgx-h100", gen_devices=8, train_devices=8, **KW)
    plan = plan.model_copy(update={"staleness": 1, "partial_rollout": True})
    p = predict(g, plan, WL)
    for name, sc in p.stages.items():
        one = price_unit(g, plan, name, WL)
        assert one.time_s == pytest.approx(sc.time_s, rel=1e-12)
        assert one.memory_gb == pytest.approx(sc.memory_gb)
        assert one.flops == pytest.approx(sc.flops)
    with pytest.raises(KeyError):
        price_unit(g, plan, "nope", WL)


def test_local_cpu_uses_the_measured_runtime_overheads():
    cl = specs.cluster("local-cpu")
    assert cl.dispatch_s is not None and cl.step_overhead_s is not None
    g = builders.build("grpo")
    plan = colocated_plan(g, "local-cpu", model="rpeg-tiny")
    wl = Workload(16, 8, 32, 16, train_minibatches=4, precision="fp32")
    p = predict(g, plan, wl)
    assert p.stages["reward"].time_s >= cl.dispatch_s
    assert p.step_s >= cl.step_overhead_s + len(p.stages) * cl.dispatch_s


def test_cpu_runtime_weight_sync_is_a_version_bump_at_k0_and_an_in_process_copy_at_k1():
    # rpeg's CPU runtime samples with the training model in one process (clusters.yaml
    # local-cpu runtime.reuses_rollout_logprobs): no copy at k=0; at k=1 the lagging engine
    # copy is refreshed in process: read + write of the weights at memory speed plus the
    # measured per-tensor cost.
    cl = specs.cluster("local-cpu")
    m = specs.model("rpeg-tiny")
    wl = Workload(16, 8, 32, 16, train_minibatches=4, precision="fp32")
    g0 = builders.build("grpo")
    p0 = predict(g0, colocated_plan(g0, "local-cpu", model="rpeg-tiny"), wl)
    assert p0.stages["sync_weights"].time_s == pytest.approx(cl.dispatch_s)
    g1 = builders.build("grpo", staleness=1)
    plan1 = colocated_plan(g1, "local-cpu", model="rpeg-tiny").model_copy(update={"staleness": 1})
    sc = predict(g1, plan1, wl).stages["sync_weights"]
    copy_s = 2 * m.params * 4.0 / cl.gpu.hbm_bytes_per_s  # fp32 weights, read + write
    assert sc.detail["refit_bytes_s"] == pytest.approx(copy_s, rel=1e-6)
    assert sc.detail["refit_tensors_s"] == pytest.approx(m.hf_tensors * cl.refit_tensor_s)
    assert sc.time_s == pytest.approx(copy_s + m.hf_tensors * cl.refit_tensor_s + cl.dispatch_s)
    # a GPU stack has no per-tensor figure: it pays the whole-model export (next test)
    assert specs.cluster("dgx-h100").refit_tensor_s is None


@pytest.mark.parametrize("gen_tp", [1, 2, 8])
def test_gpu_refit_moves_the_whole_hf_model_to_every_engine_rank(gen_tp):
    """A GPU stack's refit = the engine shard over the link + the whole bf16 model in the HF
    layout at 1/refit_s_per_gb (every engine rank's load_weights receives unsharded
    tensors), whatever the engine's TP. Hand-worked for Llama-3.1-8B: 8.03e9 params x 2 B
    = 16.06 GB at 23 GB/s = 0.698 s (DeepSeek-V3, the constant's basis: 1,342 GB -> 58 s)."""
    g = builders.build("grpo")
    plan = colocated_plan(g, "dgx-h100", **KW)
    plan = plan.model_copy(
        update={
            "units": {
                k: (u.model_copy(update={"tp": gen_tp}) if "generate" in k else u)
                for k, u in plan.units.items()
            }
        }
    )
    m = specs.model("llama3.1-8b")
    sc = predict(g, plan, WL).stages["sync_weights"]
    assert m.params == pytest.approx(8.03e9, rel=1e-3)
    assert sc.detail["refit_export_s"] == pytest.approx(0.698, rel=2e-3)
    export = sc.detail["refit_export_s"]
    assert "refit_tensors_s" not in sc.detail
    assert sc.time_s == pytest.approx(export + sc.detail["refit_bytes_s"] + DEFAULT.dispatch_s)
