"""One Prefect test harness and one 2-worker Dask LocalCluster for the session, shared by
every architecture's distributed run (as tests/runtime/actors/conftest.py does)."""

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
