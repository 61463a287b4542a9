"""End to end on the built-in task (tiny shape): k=2 on disjoint devices, fused vs unfused.

Assertions come from the measured timeline (``_extra["timeline"]``: one record per unit and
step, times from the step's start; ``step_offsets_s``; ``stage_spans``: every stage inside an
actor call, seconds from the run's origin).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def _run(cfg, cluster, **kw):
    from rpeg.flows.entry import train_on

    return train_on(cluster, cfg, progress=False, **kw)


def _absolute(ex):
    off = {int(k): v for k, v in ex["step_offsets_s"].items()}
    return [
        dict(r, a=r["start_s"] + off[r["step"]], b=r["end_s"] + off[r["step"]])
        for r in ex["timeline"]
    ]


def test_k2_generation_runs_ahead_of_training(tmp_path, prefect_harness, dask_cluster, make_config):
    cfg = make_config(
        tmp_path, **{"runtime.steps": 4, "runtime.max_staleness": 2, "cluster.num_devices": 2}
    )
    s = _run(cfg, dask_cluster)
    ex = s["_extra"]
    hist = ex["history"]
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    lags = [h["staleness_max"] for h in hist]
    assert max(lags) <= 2, lags  # the bound holds at every step
    assert max(lags) >= 1, lags  # and the generator did run ahead
    recs = _absolute(ex)
    gen = {r["step"]: r for r in recs if "generate" in r["kind"]}
    train = {r["step"]: r for r in recs if "train_actor" in r["kind"]}
    assert {r["device_group"] for r in gen.values()} == {"0"}
    assert {r["device_group"] for r in train.values()} == {"1"}
    for st in range(cfg.runtime.steps - 1):
        # generation of step s+1 does not wait for training of step s: it starts before
        # that training ends (it overlaps it, or it ran ahead of it entirely)
        assert gen[st + 1]["a"] < train[st]["b"], (st, gen[st + 1], train[st])
    # and generation of a later step runs while the training pool works on step s (its
    # log-prob, advantage or update units: with this tiny shape a generation is ~0.1 s and
    # any of them can be the one it overlaps)
    pool1 = [r for r in recs if r["device_group"] == "1"]
    overlapping = [
        (r["step"], r["kind"], t)
        for r in pool1
        for t in gen
        if t > r["step"] and min(gen[t]["b"], r["b"]) > max(gen[t]["a"], r["a"])
    ]
    assert overlapping, recs


def _fused_config(cfg):
    from rpeg.compile.sources import graph_from_config
    from rpeg.ir import fuse, to_dict
    from rpeg.plan import colocated_plan

    g = fuse(graph_from_config(cfg), ["generate", "reward"], name="rollout")
    plan = colocated_plan(g, num_devices=1, micro_batch_size=cfg.workload.micro_batch_size)
    plan = plan.with_inline_graph(to_dict(g))
    return cfg.model_copy(update={"plan": plan.to_dict()})


def test_fused_group_runs_back_to_back_in_one_actor(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    steps = 2
    unfused = _run(make_config(tmp_path / "u", **{"runtime.steps": steps}), dask_cluster)
    fused_cfg = _fused_config(make_config(tmp_path / "f", **{"runtime.steps": steps}))
    fused = _run(fused_cfg, dask_cluster)
    compiled = (tmp_path / "f" / "out" / "compiled_step.yaml").read_text()
    assert "fused: true" in compiled

    def spans(ex, stage):
        return {sp["step"]: sp for sp in ex["stage_spans"] if sp["stage"] == stage}

    fu, un = fused["_extra"], unfused["_extra"]
    # fused: one unit (one flow task, one actor call) per step holds both stages
    assert sum(1 for r in fu["timeline"] if r["kind"] == "generate+reward") == steps
    assert not any(r["kind"] == "reward" for r in fu["timeline"])
    fg, fr = spans(fu, "generate"), spans(fu, "reward")
    ug, ur = spans(un, "generate"), spans(un, "reward")
    for st in range(steps):
        assert fg[st]["unit"] == fr[st]["unit"] == "rollout"
        assert fg[st]["pid"] == fr[st]["pid"]
        # back to back: no flow round trip (Prefect task + Dask actor call, >= ms) between
        assert fr[st]["start_s"] - fg[st]["end_s"] < 2e-3, (fg[st], fr[st])
        # unfused: two units, two flow tasks, two actor calls
        assert ug[st]["unit"] != ur[st]["unit"]
        assert ur[st]["start_s"] - ug[st]["end_s"] > fr[st]["start_s"] - fg[st]["end_s"]
    # fusion changes where stages run, not what they compute
    for a, b in zip(un["history"], fu["history"], strict=True):
        for k in ("reward_mean", "pg_loss", "kl", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    tl = json.loads((tmp_path / "f" / "out" / "timeline.json").read_text())
    assert tl["stage_spans"] and tl["records"]
