"""Streaming at k = 0 runs the generation and training pools at the same time: on CPU
workers they share the machine's cores as the pools of a k >= 1 plan do (rpeg.perf.
time_sharing.busy_floor, applied by rpeg.perf.pricing to both schedules)."""

import pytest

from rpeg import specs
from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.plan import disaggregated_plan

WL = Workload(
    num_prompts=8,
    samples_per_prompt=4,
    mean_prompt_tokens=8,
    max_response_tokens=16,
    mean_response_tokens=4,
    train_minibatches=2,
)


def _streamed():
    g = builders.build("grpo", use_reference=False)
    plan = disaggregated_plan(g, "local-cpu", gen_devices=2, train_devices=2)
    return g, plan.model_copy(update={"streaming": True})


def test_streaming_pools_on_two_cores_cannot_overlap():
    g, plan = _streamed()
    cl = specs.cluster("local-cpu")  # the machine: 2 cores for 2 + 2 workers
    pred = predict(g, plan, WL, cluster=cl)
    # hand-worked: every unit runs on 2 workers, 2 cores: the floor is
    # sum(t_u x min(2, 2)) / 2 = sum(t_u), the units one after another
    work = sum(st.time_s for st in pred.stages.values())
    shared = [r for r in pred.timeline if r.kind == "cpu_share"]
    assert len(shared) == 1 and shared[0].end_s == pytest.approx(work)
    assert pred.step_s == pytest.approx(work + cl.step_overhead_s)
    assert pred.step_s == pytest.approx(max(r.end_s for r in pred.timeline))  # Gantt's end


def test_streaming_pools_with_a_core_each_overlap():
    g, plan = _streamed()
    four = specs.cluster("local-cpu", num_devices=4)  # 4 cores: no sharing
    pred = predict(g, plan, WL, cluster=four)
    assert not [r for r in pred.timeline if r.kind == "cpu_share"]
    assert pred.step_s < sum(st.time_s for st in pred.stages.values()) + four.step_overhead_s
