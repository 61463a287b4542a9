"""The rollout/trainer mismatch and the lag histogram on the distributed runtime: every step,
reduced over the data-parallel group (not one rank's shard)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

MISMATCH = ("logprob_mismatch_mean", "logprob_mismatch_k3", "logprob_mismatch_frac_over")


def _run(cfg, cluster):
    from rpeg.flows.entry import train_on

    return train_on(cluster, cfg, progress=False)


@pytest.mark.parametrize("k", [0, 1])
def test_mismatch_and_lags_every_step_over_two_ranks(
    tmp_path, prefect_harness, dask_cluster, make_config, k
):
    # 2 prompts x 2 samples = 4 rows a step on 2 devices: k = 0 is one data-parallel group
    # of two ranks (2 rows each), k = 1 a rollout group and a training group. Every step's
    # histogram counts all 4 rows (the group's sum, not one rank's 2), at lag <= k
    cfg = make_config(
        tmp_path, **{"runtime.steps": 3, "runtime.max_staleness": k, "cluster.num_devices": 2}
    )
    s = _run(cfg, dask_cluster)
    if k == 0:
        assert s["layout"][next(iter(s["layout"]))]["dp"] == 2  # one group, two ranks
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    hist = [json.loads(x) for x in lines]
    assert len(hist) == 3
    for h in hist:
        for key in MISMATCH:
            assert key in h, (key, sorted(h))
        if h["staleness_lag_0"] == 4.0:  # the trainer's weights sampled every row: no mismatch
            assert h["logprob_mismatch_mean"] < 1e-3, hist
        assert sum(h[f"staleness_lag_{i}"] for i in range(k + 1)) == 4.0, hist
        assert f"staleness_lag_{k + 1}" not in h and h["staleness_lag_max"] <= k
    for key in (*MISMATCH, "staleness_lag_max"):
        assert key in s
