"""Fixtures of the runtime tests: one torch thread; a small tiny-family model; one Prefect test
harness and one 2-worker Dask LocalCluster per session, shared by tests/runtime/actors and
tests/runtime/models (Prefect's first flow and the cluster start are the expensive parts)."""

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(1)


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


@pytest.fixture(scope="session")
def tiny():
    """A small random-init model of the tiny family (2 layers, hidden 64) + char tokenizer."""
    from rpeg.runtime.model_io import create_tiny

    model, tok = create_tiny(
        seed=0,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model.eval()
    return model, tok
