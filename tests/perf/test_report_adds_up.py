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


def _stage(name, kind, t):
    from rpeg.perf.prediction import StageCost

    return StageCost(name, (kind,), "0", 1, time_s=t)


def _flow(times, pools, m):
    """schedule.streamed over units named after their kind, one member each."""
    from rpeg.perf.schedule import streamed

    stages = {k: _stage(k, k, t) for k, t in times.items()}
    units = [(k, ((k, k, "policy"),)) for k in times]
    timeline = []
    end = streamed(stages, units, pools, m, timeline)
    return end, {r.stage: (r.start_s, r.end_s) for r in timeline}


def test_streaming_step_is_a_flow_shop_of_the_mini_batches():
    # trainer faster than generation: 4 chunks of 2 s generated; each trains in 1 s after
    # it is ready (ends 3, 5, 7, 9): the step is gen + train / m = 8 + 1 = 9 s
    end, rec = _flow({"generate": 8.0, "train_actor": 4.0}, {"generate": 0, "train_actor": 1}, 4)
    assert end == pytest.approx(9.0)
    assert rec["train_actor"] == pytest.approx((2.0, 9.0))
    # trainer slower: it starts with the first chunk (2 s) and then never waits: 2 + 16 = 18,
    # and the weight sync follows the last update
    end, rec = _flow(
        {"generate": 8.0, "train_actor": 16.0, "sync_weights": 0.5},
        {"generate": 0, "train_actor": 1, "sync_weights": 1},
        4,
    )
    assert end == pytest.approx(18.5)
    assert rec["sync_weights"] == pytest.approx((18.0, 18.5))


def test_units_of_one_pool_take_turns_chunk_by_chunk():
    # gen 4 s in 2 chunks (ready at 2, 4); forward 4 s and train 8 s share pool 1:
    # chunk 0: forward 2-4, train 4-8; chunk 1: forward 8-10 (pool busy), train 10-14
    end, rec = _flow(
        {"generate": 4.0, "old_logprob": 4.0, "train_actor": 8.0},
        {"generate": 0, "old_logprob": 1, "train_actor": 1},
        2,
    )
    assert end == pytest.approx(14.0)
    assert rec["old_logprob"] == pytest.approx((2.0, 10.0))
    assert rec["train_actor"] == pytest.approx((4.0, 14.0))


def test_a_streaming_plan_never_starts_a_unit_before_the_step_nor_overfills_a_pool():
    # `rpeg plan configs/builtin.yaml` printed 'train_actor 2.13 s ... ends 1.44 s' (a
    # start at -0.7 s) for such a plan: the trainer's pool did 3 s of work in a 1.5 s step
    g = builders.build("grpo", use_reference=True)
    plan = disaggregated_plan(
        g, "dgx-h100", num_nodes=2, gen_devices=8, train_devices=8, model="llama3.1-8b"
    ).model_copy(update={"streaming": True})
    # long prompts, short answers, 4 mini-batches: the trainer's pool has ~34 s of work
    # against ~10 s of generation (the old schedule priced the step at 21.9 s)
    wl = Workload(
        num_prompts=64,
        samples_per_prompt=16,
        mean_prompt_tokens=1024,
        max_response_tokens=256,
        mean_response_tokens=128,
        train_minibatches=4,
    )
    p = predict(g, plan, wl, calib=SHIPPED)
    assert min(r.start_s for r in p.timeline) >= 0.0
    assert max(r.end_s for r in p.timeline) == pytest.approx(p.step_s)
    busy = {}
    for sc in p.stages.values():
        busy[sc.devices] = busy.get(sc.devices, 0.0) + sc.time_s
    assert max(busy.values()) <= p.step_s + 1e-9
