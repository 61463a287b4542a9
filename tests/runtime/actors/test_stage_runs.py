"""``rpeg train`` runs at pipeline (pp) and context (cp) parallelism end to end on CPU ranks
(gloo): the built-in task on the built-in model widened to 8 layers, 2 steps, every model unit
of the plan at the layout (generation on a whole copy at tp 1). Each layout gives the
data-parallel run's first step -- the same responses (layout-invariant sampling), so the same
gradient norm, KL and entropy to round-off -- and finite losses; a pipelined rank holds about
half the actor; a run checkpointed at dp=2 resumes at pp=2 with the dp=2 run's second step
(the same weights and optimizer state). With engine fsdp, cp=2 and cp=2 x dp=2 shard the
parameters over the dp x cp ranks (a half / a quarter per rank) with the same steps, and a run
checkpointed at fsdp cp=2 resumes at dp=2 replicas."""

from __future__ import annotations

import json
import math

import pytest

from tests.runtime.stage_run_cases import stage_config

pytestmark = pytest.mark.slow

COMPARED = ("grad_norm", "kl", "entropy", "pg_loss", "reward_mean")


def _steps(cfg) -> list[dict]:
    from pathlib import Path

    path = Path(cfg.runtime.output_dir) / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if "grad_norm" in r]


def _run(cluster, cfg, **kw):
    from rpeg.flows.entry import train_on

    return train_on(cluster, cfg, progress=False, **kw)


def _same(got: dict, want: dict) -> None:
    for k in COMPARED:
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k


@pytest.fixture(scope="module")
def dp_steps(tmp_path_factory, prefect_harness, dask_cluster):
    """The data-parallel run (dp=2 replicas, the same plan at pp=cp=1): its steps' metrics."""
    cfg = stage_config(tmp_path_factory.mktemp("dp"), **{"runtime.steps": 2})
    s = _run(dask_cluster, cfg)
    assert s["layout"]["g0"]["dp"] == 2
    return _steps(cfg)


@pytest.mark.parametrize(
    ("kw", "degrees"),
    [
        ({"pp": 2}, (2, 1, "1f1b")),
        ({"pp": 2, "schedule": "interleaved_1f1b"}, (2, 1, "interleaved_1f1b")),
        ({"cp": 2}, (1, 2, "1f1b")),
    ],
    ids=["pp2_1f1b", "pp2_interleaved", "cp2"],
)
def test_two_ranks_train_at_pp_or_cp_like_data_parallel(
    tmp_path, dask_cluster, dp_steps, kw, degrees
):
    cfg = stage_config(tmp_path, **kw, **{"runtime.steps": 2})
    s = _run(dask_cluster, cfg)
    lay = s["layout"]["g0"]
    assert (lay["pp"], lay["cp"], lay["pp_schedule"], lay["dp"]) == (*degrees[:2], degrees[2], 1)
    steps = _steps(cfg)
    assert len(steps) == 2
    assert all(math.isfinite(r[k]) for r in steps for k in COMPARED)
    _same(steps[0], dp_steps[0])  # the same first step as data parallelism
    _same(steps[1], dp_steps[1])  # the generation copy was refreshed from the trained stages
    # bytes per rank (actor + reference + generation copy) against the whole roles
    held, full = s["param_bytes_per_rank"]["g0"], s["full_param_bytes"]
    if degrees[0] > 1:  # actor and reference: one stage each (~1/2); the engine copy whole
        assert all(0.6 * full < b < 0.75 * full for b in held), (held, full)
    else:  # cp: whole weights on every rank, the engine decodes on the actor's
        assert held == [full, full]
    assert len(s["peak_memory"]["g0"]) == 2 and all(
        m["peak_rss_bytes"] > 0 for m in s["peak_memory"]["g0"]
    )
    if degrees[0] > 1:
        _timeline_runs_the_schedule(cfg, degrees[2])


def _timeline_runs_the_schedule(cfg, schedule: str) -> None:
    """The run's timeline.json holds each pipeline rank's training actions (what
    benchmarks/plot_pipeline_timeline.py draws): per step and rank, the schedule's own order
    of forwards and backwards for every optimizer step's micro-batches, each action inside
    the step's train_actor span on that rank."""
    from pathlib import Path

    from rpeg.runtime.pipeline import schedule_orders

    tl = json.loads((Path(cfg.runtime.output_dir) / "timeline.json").read_text())
    acts, spans = tl["pipeline_actions"], tl["stage_spans"]
    assert {a["step"] for a in acts} == {0, 1}
    for step in (0, 1):
        for rank in (0, 1):
            mine = [a for a in acts if (a["step"], a["rank"]) == (step, rank)]
            got = [(a["kind"], a["chunk"], a["micro"]) for a in mine]
            m = max(a["micro"] for a in mine) + 1
            order = [(x.kind, x.chunk, x.micro) for x in schedule_orders(schedule, 2, m)[rank]]
            assert got == order * (len(got) // len(order)), (step, rank)
            (train,) = [
                sp
                for sp in spans
                if (sp["step"], sp["rank"], sp["stage"]) == (step, rank, "train_actor")
            ]
            assert all(
                train["start_s"] - 1e-3 <= a["start_s"] <= a["end_s"] <= train["end_s"] + 1e-3
                and 0 <= a["wait_s"] <= a["end_s"] - a["start_s"] + 1e-6
                for a in mine
            )


def test_pp2_x_dp2_on_four_ranks_like_data_parallel(tmp_path, prefect_harness, dp_steps):
    from rpeg.infra import start_cluster

    cfg = stage_config(tmp_path, n=4, pp=2, **{"runtime.steps": 2})
    cluster = start_cluster(n_workers=4, torch_threads=1)
    try:
        s = _run(cluster, cfg)
    finally:
        cluster.close()
    lay = s["layout"]["g0"]
    assert (lay["dp"], lay["pp"]) == (2, 2)
    steps = _steps(cfg)
    _same(steps[0], dp_steps[0])
    _same(steps[1], dp_steps[1])


def test_a_dp2_checkpoint_resumes_at_pp2_with_the_same_weights(tmp_path, dask_cluster, dp_steps):
    ck = {
        "runtime.checkpoint_url": str(tmp_path / "ck"),
        "runtime.checkpoint_every": 1,
        "runtime.run_id": "dp-to-pp",
    }
    first = stage_config(tmp_path, **ck, **{"runtime.steps": 1})
    assert _run(dask_cluster, first)["layout"]["g0"]["dp"] == 2
    later = stage_config(
        tmp_path, pp=2, **ck, **{"runtime.steps": 2, "runtime.allow_change": ["layout"]}
    )
    s = _run(dask_cluster, later, resume=True)
    assert s["steps_run"] == 1 and s["layout"]["g0"]["pp"] == 2
    # step 2 at pp=2 from the dp=2 checkpoint is the uninterrupted dp=2 run's step 2
    _same(_steps(later)[-1], dp_steps[1])


def test_a_pp2_run_checkpoints_its_stages_and_resumes(tmp_path, dask_cluster, dp_steps):
    ck = {
        "runtime.checkpoint_url": str(tmp_path / "ck"),
        "runtime.checkpoint_every": 1,
        "runtime.run_id": "pp-to-pp",
    }
    _run(dask_cluster, stage_config(tmp_path, pp=2, **ck, **{"runtime.steps": 1}))
    # each stage wrote its own shards (DCP, one file per rank) under the unsplit names
    assert len(list((tmp_path / "ck").rglob("g0.dcp/__*_0.distcp"))) == 2
    later = stage_config(tmp_path, pp=2, **ck, **{"runtime.steps": 2})
    s = _run(dask_cluster, later, resume=True)
    assert s["steps_run"] == 1
    _same(_steps(later)[-1], dp_steps[1])  # the stages and the generation copy resumed


def test_a_pp2_trainer_syncs_its_stages_to_a_separate_generator(
    tmp_path, prefect_harness, dp_steps
):
    from rpeg.infra import start_cluster

    over = {u: {"devices": "1-2"} for u in ("ref_logprob", "old_logprob", "advantage")}
    over |= {u: {"devices": "1-2"} for u in ("train_actor", "sync_weights")}
    over |= {"generate": {"devices": "0"}, "reward": {"devices": "0"}}
    cfg = stage_config(tmp_path, n=3, pp=2, units_over=over, **{"runtime.steps": 2})
    cluster = start_cluster(n_workers=3, torch_threads=1)
    try:
        s = _run(cluster, cfg)
    finally:
        cluster.close()
    assert s["layout"]["g1"]["pp"] == 2 and s["layout"]["g0"]["devices"] == [0]
    # the whole model in buckets, each tensor broadcast from the stage holding it
    from rpeg.runtime.model_io import create_tiny

    whole, _ = create_tiny(seed=0, num_hidden_layers=8)
    assert s["weight_sync_bytes"] >= sum(p.numel() * p.element_size() for p in whole.parameters())
    steps = _steps(cfg)
    _same(steps[0], dp_steps[0])
    _same(steps[1], dp_steps[1])  # generated by the synced weights


def test_two_ranks_train_at_fsdp_cp2_like_data_parallel(tmp_path, dask_cluster, dp_steps):
    # FSDP2 over the cp ranks (rpeg.runtime.context_parallel.context_fsdp): built on the meta
    # device, each rank filled with its half; the engine decodes on the sharded actor
    cfg = stage_config(tmp_path, cp=2, engine="fsdp", **{"runtime.steps": 2})
    s = _run(dask_cluster, cfg)
    _fsdp_cp_like_data_parallel(s, cfg, dp_steps, dp=1, share=0.5)


def test_fsdp_cp2_x_dp2_on_four_ranks_like_data_parallel(tmp_path, prefect_harness, dp_steps):
    from rpeg.infra import start_cluster

    cfg = stage_config(tmp_path, n=4, cp=2, engine="fsdp", **{"runtime.steps": 2})
    cluster = start_cluster(n_workers=4, torch_threads=1)
    try:
        s = _run(cluster, cfg)
    finally:
        cluster.close()
    _fsdp_cp_like_data_parallel(s, cfg, dp_steps, dp=2, share=0.25)


def _fsdp_cp_like_data_parallel(s, cfg, dp_steps, dp: int, share: float) -> None:
    """An fsdp cp=2 x dp run: its layout, the data-parallel run's two steps, and each rank
    holding ``share`` of the roles' bytes (within 0.05)."""
    lay = s["layout"]["g0"]
    assert (lay["cp"], lay["dp"], lay["fsdp"]) == (2, dp, True)
    steps = _steps(cfg)
    _same(steps[0], dp_steps[0])
    _same(steps[1], dp_steps[1])
    held, full = s["param_bytes_per_rank"]["g0"], s["full_param_bytes"]
    assert all((share - 0.05) * full < b < (share + 0.05) * full for b in held), (held, full)


def test_an_fsdp_cp2_checkpoint_resumes_at_dp2_with_the_same_weights(
    tmp_path, dask_cluster, dp_steps
):
    ck = {
        "runtime.checkpoint_url": str(tmp_path / "ck"),
        "runtime.checkpoint_every": 1,
        "runtime.run_id": "cp-to-dp",
    }
    first = stage_config(tmp_path, cp=2, engine="fsdp", **ck, **{"runtime.steps": 1})
    assert _run(dask_cluster, first)["layout"]["g0"]["cp"] == 2
    later = stage_config(tmp_path, **ck, **{"runtime.steps": 2, "runtime.allow_change": ["layout"]})
    s = _run(dask_cluster, later, resume=True)
    assert s["steps_run"] == 1 and s["layout"]["g0"]["dp"] == 2
    # step 2 at dp=2 from the fsdp cp=2 checkpoint is the uninterrupted dp=2 run's step 2
    _same(_steps(later)[-1], dp_steps[1])
