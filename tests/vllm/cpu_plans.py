"""The run-config parts that put every execution unit of a graph on ``ranks`` local-cpu
ranks (the distributed runtime's two-rank runs of tests/vllm)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def all_units_on(units: Sequence[str], ranks: int) -> dict[str, Any]:
    """``cluster`` and ``plan`` config sections: ``ranks`` Dask workers on local-cpu, every
    unit of ``units`` on devices 0..ranks-1, on-policy."""
    devices = f"0-{ranks - 1}"
    return {
        "cluster": {"name": "local-cpu", "n_workers": ranks, "num_devices": ranks},
        "plan": {
            "cluster": "local-cpu",
            "model": "rpeg-tiny",
            "graph": {"builder": None},
            "staleness": 0,
            "units": {u: {"devices": devices} for u in units},
        },
    }
