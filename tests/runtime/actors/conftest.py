"""Shared fixtures of the actor tests (the session's Prefect harness and Dask cluster are in
tests/runtime/conftest.py, shared with tests/runtime/models)."""

from __future__ import annotations

import pytest


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
