"""Shared fixtures: one Prefect test harness and one 2-worker Dask LocalCluster per session
(Prefect's first flow and the cluster start are the expensive parts)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def dask_cluster():
    from rpeg.infra import start_cluster

    cl = start_cluster(n_workers=2, torch_threads=1)
    yield cl
    cl.close()


@pytest.fixture
def make_config():
    return tiny_config


def tiny_config(tmp_path, **over):
    from rpeg.config import RunConfig

    d = {
        "algorithm": {"kl_coef": 0.1, "entropy_coef": 0.01},
        "workload": {
            "num_prompts": 2,
            "samples_per_prompt": 2,
            "max_response_tokens": 6,
            "micro_batch_size": 4,
        },
        "task": {"heldout_size": 2},
        "runtime": {"steps": 3, "output_dir": str(tmp_path / "out")},
        "cluster": {"n_workers": 2, "num_devices": 1},
    }
    for k, v in over.items():
        sec, field = k.split(".")
        d.setdefault(sec, {})[field] = v
    return RunConfig.from_dict(d)
