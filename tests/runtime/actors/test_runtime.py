"""The distributed runtime end to end on a 2-worker LocalCluster under Prefect."""

from __future__ import annotations

import json
import os

import pytest

from rpeg.errors import ConfigError

KEYS = ("entropy", "kl", "grad_norm", "pg_loss", "response_length")
pytestmark = pytest.mark.slow


def _run(cfg, cluster, **kw):
    from rpeg.flows.entry import train_on

    return train_on(cluster, cfg, progress=False, **kw)


def _close(a, b, tol=1e-4):
    for k in KEYS:
        if k in a or k in b:
            assert abs(a[k] - b[k]) <= tol * max(1.0, abs(a[k])), (k, a[k], b[k])


def test_sync_run_reproduces_the_single_process_trainer(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    tiny_config = make_config
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = tiny_config(tmp_path)
    ref = LocalTrainer(cfg)
    hist = [ref.step() for _ in range(cfg.runtime.steps)]
    s = _run(cfg, dask_cluster)
    got = s["_extra"]["history"]
    assert s["steps"] == len(got) == 3
    for a, b in zip(hist, got, strict=True):
        _close(a, b)
    assert set(s) - {"_extra"} == {
        "steps",
        "steps_run",  # this call's steps (fewer after a resume)
        "wall_s",  # the whole run's, restored steps included
        "segment_wall_s",  # this call's
        "median_step_s",
        "reward_first10",
        "reward_last10",
        "heldout_acc_before",
        "heldout_acc_after",
        # rollout/trainer mismatch and policy-version lags over the run (docs/engine.md)
        "logprob_mismatch_mean",
        "logprob_mismatch_k3",
        "logprob_mismatch_frac_over",
        "logprob_mismatch_max",
        "staleness_lag_mean",
        "staleness_lag_max",
        "staleness_update_lag_max",
        # the distributed run adds its layout and data plane (docs/runtime.md)
        "layout",
        "param_bytes_per_rank",
        "full_param_bytes",
        "peak_memory",
        "predicted_peak_memory",  # the plan's per-rank peak beside it (docs/parallelism.md)
        "driver_bytes_per_step",
        "batch_bytes_per_step",
        "actor_to_actor_bytes_per_step",
        "weight_sync_bytes",
        "weight_sync_s",
        # lost workers recovered from and the samples that made it generate again (faults.md)
        "recoveries",
        "regenerated_samples",
    }
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    # both runtimes: ``step`` an integer counted as the console counts (1-based)
    assert [json.loads(x)["step"] for x in lines] == [h["step"] for h in hist] == [1, 2, 3]


def test_resume_reproduces_an_uninterrupted_run(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    tiny_config = make_config
    full = _run(tiny_config(tmp_path / "a", **{"runtime.steps": 4}), dask_cluster)["_extra"][
        "history"
    ]
    ck = str(tmp_path / "ck")
    first = tiny_config(
        tmp_path / "b",
        **{"runtime.steps": 2, "runtime.checkpoint_url": ck, "runtime.checkpoint_every": 1},
    )
    _run(first, dask_cluster)
    second = first.with_overrides({"runtime.steps": 4})
    res = _run(second, dask_cluster, resume=True)
    hist = res["_extra"]["history"]
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    for a, b in zip(full[2:], hist[2:], strict=True):
        _close(a, b)


def test_async_k1_two_groups_overlap_rollout_and_training(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    tiny_config = make_config
    cfg = tiny_config(
        tmp_path, **{"runtime.steps": 4, "runtime.max_staleness": 1, "cluster.num_devices": 2}
    )
    s = _run(cfg, dask_cluster)
    ex = s["_extra"]
    assert s["steps"] == 4 and max(h["staleness_max"] for h in ex["history"]) <= 1
    assert ex["weight_sync"] and all(w["weight_sync_bytes"] > 0 for w in ex["weight_sync"])
    off = {int(k): v for k, v in ex["step_offsets_s"].items()}
    recs = ex["timeline"]

    def absolute(r):
        return r["start_s"] + off[r["step"]], r["end_s"] + off[r["step"]]

    # rollouts (devices 0) run while an earlier step trains (devices 1)
    gens = [absolute(r) for r in recs if r["device_group"] == "0"]
    trains = [absolute(r) for r in recs if r["device_group"] == "1"]
    overlaps = sum(min(g[1], t[1]) > max(g[0], t[0]) for g in gens for t in trains)
    assert overlaps >= 1, recs


def test_two_data_parallel_ranks_stay_identical(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    tiny_config = make_config
    cfg = tiny_config(tmp_path, **{"runtime.steps": 2, "cluster.num_devices": 2})
    s = _run(cfg, dask_cluster)
    a, b = s["_extra"]["param_checksums"]
    assert a == pytest.approx(b, rel=1e-9, abs=1e-6)


def test_worker_kill_recovers_from_the_last_checkpoint(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    """kill -9 of the trainer's worker at the start of step 1: the step fails, the actors are
    re-created on live workers (after the nanny's restart) from the step-1 checkpoint and the
    run finishes with every step counted once and every prompt drawn once. (How long the
    recovery takes is a benchmark figure, not asserted here.)"""
    tiny_config = make_config
    ck = str(tmp_path / "ck")
    cfg = tiny_config(
        tmp_path,
        **{"runtime.steps": 3, "runtime.checkpoint_url": ck, "runtime.checkpoint_every": 1},
    )
    killed, runs = [], []

    pids = []

    def hook(run, step):
        runs.append(run)
        with run.client.as_current():
            pid = run.groups[run.compiled.trainer_group][0].ping().result()["pid"]
        pids.append(pid)
        if step == 1 and not killed:
            os.kill(pid, 9)
            killed.append(pid)

    s = _run(cfg, dask_cluster, fault_hook=hook)
    hist = s["_extra"]["history"]
    assert killed and s["_extra"]["recoveries"] == 1
    assert [h["step"] for h in hist] == [1, 2, 3]
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    # integers counted as the console counts (1-based)
    assert [__import__("json").loads(x)["step"] for x in lines] == [1, 2, 3]
    # 3 steps x 2 prompts drawn from the data cursor: nothing lost or drawn twice
    assert runs[-1].cursor.state_dict()["position"] == 3 * cfg.workload.num_prompts
    # after the recovery the trainer actor lives in a new (nanny-restarted) process
    assert pids[-1] != killed[0]


def test_bad_input_is_refused_before_any_actor_starts(tmp_path, make_config):
    tiny_config = make_config
    from rpeg.flows.entry import train as run_train

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        run_train(
            tiny_config(tmp_path, **{"runtime.checkpoint_url": str(f / "ck")}), progress=False
        )
    with pytest.raises(ConfigError, match="devices"):
        run_train(
            tiny_config(tmp_path).model_copy(
                update={"plan": {"units": {"generate": {"devices": "0-7"}}}}
            ),
            progress=False,
        )
