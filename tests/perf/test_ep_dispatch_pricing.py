"""Expert parallelism's dispatch priced as RPEG's ranks run it (rpeg.runtime.expert_parallel):
every forward of a split MoE layer pays the device's fixed dispatch cost (routing host work
and the waits of four all-to-alls, ``GPUSpec.ep_layer_overhead_s``, measured by
benchmarks/bench_ep_layer.py), a backward half of it; and a torch-engine generate unit on an
ep training group's devices decodes on the split experts, paying it per MoE layer at the
prefill and every decode step. Before, generation was priced as whole-expert decoding and
the all-to-alls at link latency: the CPU bench measured ep=2 at 1.03 s against 0.42 s."""

from __future__ import annotations

import pytest

from rpeg import specs
from tests.perf.test_ep_pricing import _config, _predict
from tests.runtime.models.tiny_folders import write_tiny_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_folder("qwen3_moe", tmp_path_factory.mktemp("ep") / "moe")


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
