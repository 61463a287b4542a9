"""Issue 14 item 4 end to end: with max_staleness >= 1 (rollout and training on separate
workers) a run stopped after step N and resumed, and a run that loses its trainer's worker,
finish with a summary and a timeline and reach the same metrics as an uninterrupted run
(the buffer's produced samples, their lags and rollout metrics come back from the
checkpoint)."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow

KEYS = ("reward_mean", "entropy", "kl", "grad_norm", "pg_loss", "response_length")
STEPS = 4


class Stop(Exception):
    """The process 'dies' right after a checkpoint (not a lost worker: no recovery)."""


def _cfg(make_config, path, ck):
    return make_config(
        path,
        **{
            "runtime.steps": STEPS,
            "runtime.max_staleness": 1,
            "cluster.num_devices": 2,
            "runtime.checkpoint_url": ck,
            "runtime.checkpoint_every": 1,
        },
    )


def _run(cfg, cluster, **kw):
    from rpeg.flows.entry import train_on

    return train_on(cluster, cfg, progress=False, **kw)


def _same(a, b, tol=1e-4):
    assert int(a["step"]) == int(b["step"])
    assert a["staleness_max"] == b["staleness_max"], (a["step"], a["staleness_max"])
    for k in KEYS:
        assert k in a and k in b, k
        assert abs(a[k] - b[k]) <= tol * max(1.0, abs(a[k])), (a["step"], k, a[k], b[k])


def _lines(path):
    return [
        int(json.loads(x)["step"])
        for x in (path / "out" / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.fixture
def uninterrupted(tmp_path_factory, prefect_harness, dask_cluster, make_config):
    p = tmp_path_factory.mktemp("full")
    return _run(_cfg(make_config, p, str(p / "ck")), dask_cluster)


def test_a_k1_run_stopped_after_step_n_and_resumed_reaches_the_same_metrics(
    tmp_path, uninterrupted, prefect_harness, dask_cluster, make_config
):
    full = uninterrupted["_extra"]["history"]
    assert [h["staleness_max"] for h in full] == [0.0, 1.0, 1.0, 1.0]
    cfg = _cfg(make_config, tmp_path, str(tmp_path / "ck"))

    def stop(run, step):
        if step == 2:
            raise Stop("stopped after the step-2 checkpoint")

    with pytest.raises(Stop):
        _run(cfg, dask_cluster, fault_hook=stop)
    res = _run(cfg, dask_cluster, resume=True)
    hist = res["_extra"]["history"]
    assert res["steps"] == STEPS and [h["step"] for h in hist] == [1, 2, 3, 4]
    for a, b in zip(full, hist, strict=True):
        _same(a, b)
    assert _lines(tmp_path) == [1, 2, 3, 4]  # no line without a step, none twice
    assert json.loads((tmp_path / "out" / "timeline.json").read_text())["records"]


def test_a_k1_run_that_loses_its_trainer_recovers_to_the_same_metrics(
    tmp_path, uninterrupted, prefect_harness, dask_cluster, make_config
):
    full = uninterrupted["_extra"]["history"]
    cfg = _cfg(make_config, tmp_path, str(tmp_path / "ck"))
    killed = []

    def kill(run, step):
        if step == 2 and not killed:
            pid = run.group(run.compiled.trainer_group).ping()[0]["pid"]
            os.kill(pid, 9)
            killed.append(pid)

    res = _run(cfg, dask_cluster, fault_hook=kill)
    ex = res["_extra"]
    assert killed and ex["recoveries"] == 1
    assert res["steps"] == STEPS and res["median_step_s"] > 0
    for a, b in zip(full, ex["history"], strict=True):
        _same(a, b)
    assert _lines(tmp_path) == [1, 2, 3, 4]
    assert json.loads((tmp_path / "out" / "timeline.json").read_text())["records"]
