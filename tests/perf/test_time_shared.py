"""CPU workers that outnumber the machine's cores time-share them (rpeg.perf.time_sharing):
the shipped 4-device CPU configs are priced on the 2-core local-cpu cluster instead of being
refused; a unit gets ``min(1, cores / its workers)`` of a core per worker while it runs, and
pools that run at the same time (k >= 1) cannot finish their CPU work faster than the cores
allow. Accelerator clusters still refuse a plan past their devices."""

import pytest

from rpeg import specs
from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.perf.calibration import SHIPPED
from rpeg.perf.time_sharing import busy_floor, share, time_shared, unit_context
from rpeg.perf.units import UnitContext, graph_info
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
    assert shared.num_devices == 4 and shared.num_nodes == 1  # one worker per device
    # hand-worked: 2 cores / 4 busy workers = 0.5 of a core per worker
    assert share(2, 4) == 0.5 and share(2, 2) == 1.0 and share(2, 1) == 1.0
    c = UnitContext(plan, WL, shared, specs.model("rpeg-tiny"), SHIPPED)
    half = unit_context(c, 2, 4)
    assert half.gpu.bf16_dense_tflops == pytest.approx(cl.gpu.bf16_dense_tflops / 2)
    assert half.gpu.hbm_tbps == pytest.approx(cl.gpu.hbm_tbps / 2)
    assert half.gpu.layer_overhead_s == pytest.approx(cl.gpu.layer_overhead_s * 2)
    assert half.peak_flops == pytest.approx(c.peak_flops / 2)
    # gloo runs on the ranks' own cores: half the bandwidth, twice the latency
    assert half.cluster.link("domain").bytes_per_s == pytest.approx(
        cl.link("domain").bytes_per_s / 2
    )
    assert half.cluster.link("domain").latency_s == pytest.approx(cl.link("domain").latency_s * 2)
    assert unit_context(c, 2, 2) is c  # a core each: unchanged
    # priced, not refused; every unit of the 4-worker plan at half speed costs more than
    # the same plan on 2 workers (the same total compute on the same 2 cores, plus more
    # per-rank fixed costs)
    g2, plan2 = _plan(2)
    assert predict(g, plan, WL).step_s > predict(g2, plan2, WL).step_s


def test_a_plan_within_the_cores_is_priced_on_the_machine_as_it_is():
    g, plan = _plan(2)
    cl = specs.cluster("local-cpu")
    assert time_shared(cl, plan, graph_info(g)["units"]) is cl


def test_busy_floor_is_the_units_cpu_work_over_the_cores():
    c = type("C", (), {"gpu": specs.cluster("local-cpu").gpu})()
    # hand-worked: 1.0 s on 2 workers + 0.5 s on 4 workers + 0.3 s on 1 worker, 2 cores:
    # (1.0 x 2 + 0.5 x 2 + 0.3 x 1) / 2 = 1.65 s
    times = {"a": 1.0, "b": 0.5, "c": 0.3}
    assert busy_floor(c, 2, times, {"a": 2, "b": 4, "c": 1}) == pytest.approx(1.65)
    gpu = type("C", (), {"gpu": specs.cluster("dgx-h100").gpu})()
    assert busy_floor(gpu, 8, times, {"a": 2, "b": 4, "c": 1}) == 0.0


def _async_cpu():
    from rpeg.compile.sources import resolve
    from rpeg.preflight import load_config

    g, plan = resolve(None, load_config("configs/async-cpu.yaml"))
    assert plan.staleness == 1 and {u.devices for u in plan.units.values()} == {(0, 1), (2, 3)}
    return g, plan


def test_pools_running_at_once_share_the_cores():
    """k = 1 with the generators on devices 0-1 and the trainers on 2-3 (configs/async-cpu.yaml
    on a 2-core machine): each unit alone runs at a core per worker, but both pools work at
    the same time on the same 2 cores, so the step is all units' CPU work over 2 cores --
    every unit runs on 2 workers, so that is the sum of their times -- and the Gantt ends
    there (a 'cores shared' record)."""
    g, plan = _async_cpu()
    pred = predict(g, plan, WL)
    units = sum(st.time_s for st in pred.stages.values())
    overhead = pred.timeline[-1].duration_s if pred.timeline[-1].stage == "step overhead" else 0
    assert pred.step_s == pytest.approx(units + overhead)
    shared = [r for r in pred.timeline if r.stage == "cores shared"]
    assert len(shared) == 1 and shared[0].end_s == pytest.approx(units)
    assert max(r.end_s for r in pred.timeline) == pytest.approx(pred.step_s)


def test_gpu_clusters_still_refuse_a_plan_past_their_devices():
    g, plan = _plan(16, cluster="dgx-h100", model="llama3.1-8b")
    with pytest.raises(InfeasiblePlan, match="uses device 15 but cluster dgx-h100 has 8"):
        predict(g, plan, WL, cluster=specs.cluster("dgx-h100", num_nodes=1))
