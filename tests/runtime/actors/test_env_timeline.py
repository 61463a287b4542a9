"""The distributed runtime's timeline shows a multi-turn unit's env stage (issue 31 item 1):
timeline.json's stage spans hold an ``env`` span per rank, as long as the rollout's measured
environment time (``env_s``) and ending where that rank's generate span ends."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_timeline_has_the_env_stage(tmp_path, prefect_harness, dask_cluster):
    from rpeg.flows.entry import train_on

    from rpeg.config import RunConfig

    cfg = RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {
            "optim.warmup_sft_steps": 0,
            "task.heldout_size": 2,
            "workload.num_prompts": 2,
            "workload.samples_per_prompt": 2,
            "workload.train_minibatches": 1,
            "runtime.steps": 1,
            "runtime.output_dir": str(tmp_path / "out"),
            "cluster.num_devices": 2,
            "cluster.n_workers": 2,
        }
    )
    s = train_on(dask_cluster, cfg, progress=False)
    spans = s["_extra"]["stage_spans"]
    env = [sp for sp in spans if sp["stage"] == "env"]
    gen = {sp["rank"]: sp for sp in spans if sp["stage"] == "generate"}
    assert env and {sp["unit"] for sp in env} == {"generate+env"}
    for sp in env:
        g = gen[sp["rank"]]
        assert sp["end_s"] == pytest.approx(g["end_s"], abs=1e-5)
        assert 0.0 < sp["end_s"] - sp["start_s"] <= g["end_s"] - g["start_s"]
    assert s["_extra"]["history"][0]["env_s"] > 0.0
    # the unit's own record names both kinds
    (rec,) = [r for r in s["_extra"]["timeline"] if r["stage"] == "generate+env"]
    assert rec["kind"] == "generate+env"
