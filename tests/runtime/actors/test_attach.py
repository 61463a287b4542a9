"""`rpeg train --cluster tcp://...`: the run attaches to an existing Dask scheduler, sizes its
default plan to that cluster's workers, and leaves the cluster running when it ends."""

import json

import pytest


@pytest.mark.slow  # > 10 s on 2 cores (docs/architecture.md "Tests")
def test_run_attaches_to_an_existing_scheduler_and_leaves_it_up(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    from rpeg.flows.entry import train as run_train

    cfg = make_config(tmp_path, **{"runtime.steps": 2, "cluster.num_devices": None})
    address = dask_cluster.address
    assert address.startswith("tcp://")
    summary = run_train(
        cfg, cluster_address=address, progress=False, summary_json=str(tmp_path / "s.json")
    )
    assert summary["steps"] == 2
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 2
    compiled = (tmp_path / "out" / "compiled_step.yaml").read_text()
    assert "num_devices: 2" in compiled  # the default plan spans the attached cluster's workers
    assert len(dask_cluster.workers) == 2  # the external cluster is still up and usable
    assert dask_cluster.client.submit(sum, [1, 2]).result() == 3


def _worker_env() -> dict:
    import os

    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")}


def test_local_cluster_workers_keep_glibc_dynamic_mmap_threshold(dask_cluster):
    # Dask's default MALLOC_TRIM_THRESHOLD_=65536 makes torch CPU ops ~1.4x slower in workers
    # (infra/cluster.py worker_environ); start_cluster unsets it
    for env in dask_cluster.client.run(_worker_env).values():
        assert env == {"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": "1"}
