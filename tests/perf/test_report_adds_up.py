"""The plan report adds up: the headline is the Gantt's end, every fixed cost is a named
record, "why it lost" does not invent a difference, memory lines say what holds them."""

from types import SimpleNamespace

import pytest

from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.perf.calibration import SHIPPED
from rpeg.plan import colocated_plan, disaggregated_plan
from rpeg.search.report import fixed_records, memory_words
from rpeg.search.result import why_lost

WL = Workload(
    num_prompts=64,
    samples_per_prompt=16,
    mean_prompt_tokens=128,
    max_response_tokens=2048,
    mean_response_tokens=600,
    train_minibatches=2,
)


def test_fixed_costs_are_named_records_and_the_gantt_ends_at_the_step():
    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "dgx-h100", num_nodes=1, model="llama3.1-8b")
    p = predict(g, plan, WL, calib=SHIPPED)
    names = {r.stage: r for r in fixed_records(p)}
    assert {"offload/reload", "step overhead"} <= set(names)
    # dgx-h100 takes the shipped 3 s orchestration cost per step
    assert names["step overhead"].duration_s == pytest.approx(SHIPPED.step_overhead_s)
    assert max(r.end_s for r in p.timeline) == pytest.approx(p.step_s)
    # colocated: units + offload + overhead back to back = the headline
    assert sum(r.duration_s for r in p.timeline) == pytest.approx(p.step_s)


def test_why_lost_names_no_difference_when_there_is_none():
    g = builders.build("grpo", use_reference=False)
    plan = colocated_plan(g, "dgx-h100", num_nodes=1, model="llama3.1-8b")
    p = predict(g, plan, WL, calib=SHIPPED)
    a = SimpleNamespace(step_s=p.step_s, prediction=p)
    b = SimpleNamespace(step_s=p.step_s * 1.001, prediction=p)
    text = why_lost(b, a)
    assert "same predicted step" in text and "offload" not in text


def test_memory_lines_say_the_engine_reserve():
    g = builders.build("grpo", use_reference=False)
    plan = disaggregated_plan(
        g, "dgx-h100", num_nodes=2, gen_devices=8, train_devices=8, model="llama3.1-8b"
    )
    p = predict(g, plan, WL, calib=SHIPPED)
    lines = memory_words(p)
    gen = next(x for x in lines if x.startswith("0-7"))
    assert "kv_cache" in gen and "gpu_memory_utilization" in gen
    train = next(x for x in lines if x.startswith("8-15"))
    assert "optimizer" in train and "kv_cache" not in train
