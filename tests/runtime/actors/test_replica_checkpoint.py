"""Data-parallel replicas checkpoint one copy of the model: rank 0 writes the weights and
optimizer state, the other replicas only their RNG states and versions, and a resume gives
every replica rank 0's state (issue 38 item 3). The fault matrix (test_faults_matrix) checks
that resumed runs equal uninterrupted ones."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_replicas_write_one_copy_and_resume(tmp_path, prefect_harness, dask_cluster, make_config):
    from rpeg.flows.entry import train_on

    from rpeg.runtime.actors.checkpoint import CheckpointStore

    cfg = make_config(
        tmp_path,
        **{
            "runtime.steps": 2,
            "runtime.checkpoint_url": str(tmp_path / "ck"),
            "runtime.checkpoint_every": 2,
            "runtime.run_id": "replicas",
            "cluster.num_devices": 2,  # the default plan: every unit on both, dp=2 replicas
        },
    )
    first = train_on(dask_cluster, cfg, progress=False)
    (group,) = first["layout"]
    assert first["layout"][group]["dp"] == 2 and not first["layout"][group]["fsdp"]
    _meta, parts = CheckpointStore.for_run(cfg.runtime).latest()
    rank0, rank1 = (len(parts[f"{group}-rank{r}.pt"]) for r in (0, 1))
    assert rank1 < 0.1 * rank0, (rank0, rank1)  # RNG states and versions only
    s = train_on(
        dask_cluster, cfg.with_overrides({"runtime.steps": 3}), progress=False, resume=True
    )
    assert s["steps"] == 3 and s["steps_run"] == 1
