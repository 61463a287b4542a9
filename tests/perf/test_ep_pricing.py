"""RPEG's expert parallelism priced as the runtime runs it (rpeg.runtime.expert_parallel;
docs/perf-model.md): on an FSDP trainer at ep > 1 each rank loops over its E/ep experts,
FSDP gathers only the non-expert parameters, the rank holds its experts whole; every forward
of a split MoE layer pays the device's fixed dispatch cost (routing host work and the waits of
four all-to-alls, ``GPUSpec.ep_layer_overhead_s``, measured by benchmarks/bench_ep_layer.py), a
backward half of it, and a torch-engine generate unit on an ep trainer's devices decodes on the
split experts, paying it per MoE layer at the prefill and every decode step (before, it was
priced as whole-expert decoding: the CPU bench measured ep=2 at 1.03 s against 0.42 s); and a
run config's own plan section with a model folder prices the folder, not the built-in model."""

from __future__ import annotations

import pytest

from rpeg import specs
from rpeg.config import RunConfig
from tests.runtime.models.tiny_folders import write_tiny_folder


def _config(folder, ep: int) -> RunConfig:
    units = {u: {"devices": "0-1"} for u in ("generate", "reward", "advantage", "sync_weights")}
    for u in ("ref_logprob", "old_logprob", "train_actor"):
        units[u] = {"devices": "0-1", "engine": "fsdp", "ep": ep}
    return RunConfig.from_dict(
        {
            "model": {"path": str(folder)},
            "workload": {"num_prompts": 4, "samples_per_prompt": 4, "max_response_tokens": 16},
            "cluster": {"name": "local-cpu", "n_workers": 2, "num_devices": 2},
            "plan": {"cluster": "local-cpu", "graph": {"builder": None}, "units": units},
        }
    )


def _predict(cfg):
    from rpeg.cli.perf import folder_plan
    from rpeg.compile.sources import resolve
    from rpeg.perf import predict
    from rpeg.perf.prediction import Workload
    from rpeg.specs.hf import priced_model

    graph, plan = resolve(None, cfg)
    plan = folder_plan(plan, cfg)
    spec = priced_model(cfg.model)
    assert plan.model == spec.name  # the folder's, not rpeg-tiny
    wl = Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)
    return spec, predict(graph, plan, wl, model=spec)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_folder("qwen3_moe", tmp_path_factory.mktemp("ep") / "moe")


def test_ep2_on_fsdp_loops_over_half_the_experts_gathers_the_rest_and_holds_its_experts(folder):
    spec, one = _predict(_config(folder, 1))
    _, two = _predict(_config(folder, 2))
    t1, t2 = one.stages["train_actor"], two.stages["train_actor"]
    assert t2.detail["moe_expert_loop_s"] == pytest.approx(t1.detail["moe_expert_loop_s"] / 2)
    experts = spec.moe_layers * spec.moe.experts * spec.expert_params
    rest = spec.params - experts
    from rpeg.perf.prediction import GB

    gb = 4 / GB  # fp32 weights on CPU
    assert t1.memory_gb["weights"] == pytest.approx(spec.params / 2 * gb)  # FSDP over dp=2
    assert t2.memory_gb["weights"] == pytest.approx((rest / 2 + experts / 2) * gb)
    assert sum(t2.comm_s.values()) > 0  # the all-to-alls
    assert "ep_expert_grad_sync_s" not in t2.detail  # dp = ep: no replicas to sum over


def test_decoding_on_split_experts_pays_the_dispatch_per_layer_and_forward(folder):
    cpu = specs.gpu("cpu")
    assert cpu.ep_layer_overhead_s > 0
    spec, one = _predict(_config(folder, 1))
    _, two = _predict(_config(folder, 2))
    g1, g2 = one.stages["generate"], two.stages["generate"]
    assert "ep_dispatch_s" not in g1.detail
    # at least the prefill and one decode step per token of the longest response
    forwards = 1 + g2.detail["longest_response"]
    assert g2.detail["ep_dispatch_s"] >= forwards * spec.moe_layers * cpu.ep_layer_overhead_s
    assert g2.time_s == pytest.approx(g1.time_s + g2.detail["ep_dispatch_s"], rel=1e-6)
    # a vLLM generate unit holds its own whole copy: no dispatch
    cfg = _config(folder, 2).with_overrides({"plan.units.generate.engine": "vllm"})
    assert "ep_dispatch_s" not in _predict(cfg)[1].stages["generate"].detail


def test_forward_and_training_passes_pay_the_fixed_dispatch(folder):
    cpu = specs.gpu("cpu")
    spec, one = _predict(_config(folder, 1))
    _, two = _predict(_config(folder, 2))
    ref = two.stages["ref_logprob"]
    per_pass = ref.detail["micro_batches"] * spec.moe_layers * cpu.ep_layer_overhead_s
    assert sum(ref.comm_s.values()) >= per_pass
    # training: a forward and a backward (half of it)
    assert sum(two.stages["train_actor"].comm_s.values()) >= 1.5 * per_pass


def test_gpus_without_a_measured_dispatch_price_bytes_and_latency_only():
    assert specs.gpu("h100-sxm").ep_layer_overhead_s == 0.0
