"""CPU workers that outnumber the machine's cores time-share them (rpeg.perf.time_sharing.time_shared):
the shipped 4-device CPU configs are priced on the 2-device local-cpu cluster instead of being
refused; accelerator clusters still refuse a plan past their devices."""

import pytest

from rpeg import specs
from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.perf.time_sharing import time_shared
from rpeg.perf.units import graph_info
from rpeg.plan import colocated_plan
from rpeg.plan.schema import InfeasiblePlan

WL = Workload(
    num_prompts=8,
    samples_per_prompt=4,
    mean_prompt_tokens=8,
    max_response_tokens=16,
    mean_response_tokens=4,
    train_minibatches=1,
)


def _plan(n: int, cluster: str = "local-cpu", model: str = "rpeg-tiny"):
    g = builders.build("grpo", use_reference=False)
    return g, colocated_plan(g, cluster, num_devices=n, model=model)


def test_four_workers_on_two_cores_get_half_a_core_each():
    g, plan = _plan(4)
    cl = specs.cluster("local-cpu")
    assert cl.num_devices == 2 and cl.gpu.layer_overhead_s > 0  # the machine: 2 cores
    shared = time_shared(cl, plan, graph_info(g)["units"])
    # hand-worked: 2 cores / 4 workers = 0.5 of a core per worker
    assert shared.num_devices == 4
    assert shared.gpu.bf16_dense_tflops == pytest.approx(cl.gpu.bf16_dense_tflops / 2)
    assert shared.gpu.hbm_tbps == pytest.approx(cl.gpu.hbm_tbps / 2)
    assert shared.gpu.layer_overhead_s == pytest.approx(cl.gpu.layer_overhead_s * 2)
    # priced, not refused
    assert predict(g, plan, WL).step_s > 0


def test_a_plan_within_the_cores_is_priced_on_the_machine_as_it_is():
    g, plan = _plan(2)
    cl = specs.cluster("local-cpu")
    assert time_shared(cl, plan, graph_info(g)["units"]) is cl


def test_gpu_clusters_still_refuse_a_plan_past_their_devices():
    g, plan = _plan(16, cluster="dgx-h100", model="llama3.1-8b")
    with pytest.raises(InfeasiblePlan, match="uses device 15 but cluster dgx-h100 has 8"):
        predict(g, plan, WL, cluster=specs.cluster("dgx-h100", num_nodes=1))
