"""A rank's predicted memory under pipeline, context and expert parallelism
(rpeg.perf.rank_memory): what each pipeline rank holds, the activations its schedule keeps
in flight, a sequence split over cp, experts split over ep."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from rpeg import specs
from rpeg.compile.step import GroupSpec
from rpeg.perf.rank_memory import (
    _stage_params,
    inflight_chunks,
    rank_memory,
    stage_layers,
)


def _wl(**kw):
    base = dict(
        num_prompts=16,
        samples_per_prompt=8,
        max_prompt_tokens=256,
        max_response_tokens=4096,
        train_minibatches=1,
    )
    return NS(**{**base, **kw})


def _group(ws, **kw):
    base = dict(roles=("actor",), trainable=("actor",), units=(), dp=ws)
    base.update(kw)
    roles, trainable, units = base.pop("roles"), base.pop("trainable"), base.pop("units")
    return GroupSpec("g", tuple(range(ws)), ws, roles, trainable, units, **base)


def _peak(g, model, mbs=1, wl=None):
    return rank_memory([g], model, wl or _wl(), train_micro_batch={"g": mbs}, staleness=0)[0]


@pytest.mark.parametrize(
    "layers,pp,chunks", [(8, 2, 1), (7, 2, 1), (28, 4, 1), (8, 2, 2), (30, 4, 2)]
)
def test_stage_layers_cover_the_model_once(layers, pp, chunks):
    held = [stage_layers(layers, pp, r, chunks) for r in range(pp)]
    assert sum(held) == layers
    assert max(held) - min(held) <= chunks  # chunk sizes differ by at most one


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen3-0.6b", "qwen3-30b-a3b"])
def test_stages_hold_the_model_and_the_tied_head_twice(name):
    m = specs.model(name)
    for pp in (2, 4):
        total = sum(_stage_params(m, pp, r, 1, 1) for r in range(pp))
        extra = m.vocab * m.hidden if m.tied_embeddings else 0
        assert total == pytest.approx(m.params + extra, rel=1e-9)


def test_expert_parallel_divides_only_the_routed_experts():
    m = specs.model("qwen3-30b-a3b")
    experts = m.moe_layers * m.moe.experts * m.expert_params
    one, four = _stage_params(m, 1, 0, 1, 1), _stage_params(m, 1, 0, 1, 4)
    assert one - four == pytest.approx(experts * 3 / 4, rel=1e-9)
    g1 = _group(4, fsdp=False)
    g4 = _group(4, fsdp=False, ep=4)
    w1 = _peak(g1, m).parts["actor_weights"]
    w4 = _peak(g4, m).parts["actor_weights"]
    assert w1 - w4 == pytest.approx(4.0 * experts * 3 / 4 / 1e9, rel=1e-6)


def test_one_f_one_b_keeps_fewer_micro_batches_than_gpipe():
    # 1F1B: the first rank holds pp micro-batches in flight, the last one; gpipe holds all m
    assert [inflight_chunks("1f1b", 4, 16, r) for r in range(4)] == [4, 3, 2, 1]
    assert [inflight_chunks("gpipe", 4, 16, r) for r in range(4)] == [16] * 4
    assert inflight_chunks("1f1b", 4, 2, 0) == 2  # fewer micro-batches than stages
    assert inflight_chunks("1f1b", 1, 16, 0) == 1


def test_pipeline_ranks_predict_less_than_one_rank_holding_the_whole_model():
    m = specs.model("qwen2.5-7b")
    whole = _peak(_group(2, dp=2), m, mbs=2)
    for sched in ("1f1b", "interleaved_1f1b"):
        piped = _peak(_group(2, dp=1, pp=2, pp_schedule=sched), m, mbs=2)
        assert piped.peak_gb < whole.peak_gb
        # the weights and optimizer of about half the layers, plus one embedding-sized matrix
        held = piped.parts["actor_weights"] / whole.parts["actor_weights"]
        assert 0.45 < held < 0.6
    # gpipe keeps every micro-batch's activations: more than 1F1B on the same layout
    lay = dict(dp=1, pp=2)
    one_f = _peak(_group(2, **lay, pp_schedule="1f1b"), m, mbs=1)
    gpipe = _peak(_group(2, **lay, pp_schedule="gpipe"), m, mbs=1)
    assert gpipe.parts["train:activations"] > one_f.parts["train:activations"]


def test_context_parallel_halves_a_long_sequences_activations():
    m = specs.model("qwen2.5-7b")
    wl = _wl(max_response_tokens=16384)
    one = _peak(_group(2, dp=2), m, wl=wl)
    two = _peak(_group(2, dp=1, cp=2), m, wl=wl)
    a1, a2 = one.parts["train:activations"], two.parts["train:activations"]
    assert 0.45 * a1 < a2 < 0.65 * a1  # half the tokens, plus the gathered keys and values


def test_fsdp_at_cp_shards_the_state_over_the_dp_x_cp_ranks():
    # rpeg.runtime.context_parallel.context_fsdp: the cp ranks hold the same parameters,
    # FSDP2 shards them over all dp x cp ranks (1/2 at cp=2, 1/4 at cp=2 x dp=2)
    m = specs.model("qwen2.5-7b")
    whole = _peak(_group(2, dp=1, cp=2), m).parts
    for ws, dp, share in ((2, 1, 2), (4, 2, 4)):
        part = _peak(_group(ws, dp=dp, cp=2, fsdp=True), m).parts
        for k in ("actor_weights", "actor_optimizer"):
            assert part[k] == pytest.approx(whole[k] / share), k


def _schedule_plan(schedule: str):
    from rpeg.ir import builders
    from rpeg.plan import colocated_plan

    g = builders.build("grpo")
    plan = colocated_plan(g, "dgx-h100", num_nodes=4, model="qwen2.5-32b", tp=4, pp=4)
    units = {
        n: (u.model_copy(update={"pp_schedule": schedule}) if u.pp > 1 else u)
        for n, u in plan.units.items()
    }
    return g, plan.model_copy(update={"units": units})


def test_interleaving_halves_the_priced_bubble_and_keeps_more_in_flight():
    from rpeg.perf import Workload, predict

    wl = Workload(
        num_prompts=64,
        samples_per_prompt=8,
        mean_prompt_tokens=256,
        max_response_tokens=8192,
        mean_response_tokens=4000,
        train_minibatches=4,
    )
    # pp=4 x tp=4 on 32 GPUs keeps dp=2 replicas with whole AdamW state: past 80 GB, so
    # priced without the memory check (the schedules' relative figures are the point)
    schedules = ("1f1b", "interleaved_1f1b", "gpipe")
    preds = {s: predict(*_schedule_plan(s), wl, check_memory=False) for s in schedules}
    train = {s: p.stages["train_actor"] for s, p in preds.items()}
    b1, bi = (train[s].detail["bubble"] for s in ("1f1b", "interleaved_1f1b"))
    assert b1 > 0 and bi == pytest.approx(b1 / 2, rel=1e-6)
    assert train["gpipe"].detail["bubble"] == pytest.approx(b1, rel=1e-6)
    # gpipe keeps every micro-batch's activations, interleaving a few more than 1F1B
    mem = {s: t.peak_memory_gb for s, t in train.items()}
    assert mem["gpipe"] > mem["interleaved_1f1b"] > mem["1f1b"]
