"""The memory-bound share of a pass scales with the GPU's ridge point (rpeg.perf.roofline):
hand-worked factors for the H100 (the reference), the H20 and the A100, and the trainer's
achieved GEMM share in a priced plan."""

import pytest

from rpeg import specs
from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.perf.calibration import SHIPPED
from rpeg.perf.roofline import pass_factor, ridge
from rpeg.plan import colocated_plan

WL = Workload(
    num_prompts=64,
    samples_per_prompt=32,
    mean_prompt_tokens=128,
    max_response_tokens=4096,
    mean_response_tokens=1000,
    train_minibatches=4,
)


def test_the_reference_gpu_keeps_the_shipped_factors():
    h100 = specs.gpu("h100-sxm")
    assert ridge(h100) == pytest.approx(989 / 3.35)
    assert pass_factor(0.7, h100) == pytest.approx(0.7)
    assert pass_factor(0.6, h100) == pytest.approx(0.6)


def test_a_gpu_with_more_bandwidth_per_flop_spends_less_on_memory_bound_work():
    # H20: ridge 148 / 4.0 = 37.0 FLOP/B against 295.22 for the H100: ratio 0.125330.
    # Training: non-GEMM time 1/0.7 - 1 = 0.428571 of GEMM time on the H100, 0.053713 on
    # the H20: factor 1 / 1.053713 = 0.949025. Forward: 0.666667 x 0.125330 = 0.083553,
    # factor 0.922887.
    h20 = specs.gpu("h20")
    assert pass_factor(0.7, h20) == pytest.approx(0.949025, rel=1e-5)
    assert pass_factor(0.6, h20) == pytest.approx(0.922887, rel=1e-5)
    # A100: ridge 312 / 2.039 = 153.016, ratio 0.518306: 1 / (1 + 0.428571 x 0.518306)
    assert pass_factor(0.7, specs.gpu("a100-80g")) == pytest.approx(0.818243, rel=1e-5)


def test_the_trainer_of_a_plan_on_h20_reaches_the_roofline_share_of_its_gemm_rate():
    g = builders.build("grpo", use_reference=True)
    for cluster, gpu, expected in (("dgx-h100", "h100-sxm", 0.7), ("h20-cluster", "h20", 0.949025)):
        plan = colocated_plan(g, cluster, num_nodes=2, model="llama3.1-8b", pp=2)
        # packed micro-batches of the sequence budget (the published systems' pipelines)
        units = {n: u.model_copy(update={"seq_packing": True}) for n, u in plan.units.items()}
        plan = plan.model_copy(update={"units": units})
        d = predict(g, plan, WL, calib=SHIPPED).stages["train_actor"].detail
        m = specs.model("llama3.1-8b")
        tok_mb = min(plan.units["train_actor"].micro_batch_size * (128 + 4096), 1e12)
        gemm = 2.0 * tok_mb * m.hidden * max(m.ffn_hidden, m.attn_width)
        eff = specs.gpu(gpu).matmul_eff(gemm)
        assert d["mfu_gemm_dense"] == pytest.approx(eff * expected, rel=1e-5)
