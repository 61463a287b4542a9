"""A run with a rank killed at a fault point next to the same run uninterrupted (issue 28).

    python benchmarks/fault_recovery.py OUT_DIR "group=* rank=1 phase=train step=1" \
        '{"cluster.num_devices": 2}'
    python benchmarks/fault_recovery.py OUT_DIR none '{"cluster.num_devices": 2}'

The config is tests/runtime/actors/conftest.py's tiny one (3 steps, checkpoint every step)
plus the JSON overrides; the spec is rpeg.runtime.actors.fault_points' (``once=`` is added,
under OUT_DIR). Prints the wall time, the recoveries, the reward per step and the final
weights' checksums, then a SUMMARY line. docs/runtime.md "Faults" has the numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tests" / "runtime" / "actors"))
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    spec = sys.argv[2]
    over = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    if spec != "none":
        os.environ["RPEG_FAULT_AT"] = f"{spec} once={out}/fired"
    from conftest import tiny_config
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster

    n = int(over.pop("n_workers", 2))
    cfg = tiny_config(
        out,
        **{
            "runtime.steps": 3,
            "runtime.checkpoint_url": str(out / "ck"),
            "runtime.checkpoint_every": 1,
            "cluster.n_workers": n,
            **over,
        },
    )
    with prefect_test_harness(server_startup_timeout=120):
        cl = start_cluster(n_workers=n, torch_threads=1)
        t0 = time.time()
        try:
            s = train_on(cl, cfg, progress=False)
        finally:
            cl.close()
    wall = time.time() - t0
    rewards = [round(h["reward_mean"], 4) for h in s["_extra"]["history"]]
    sums = s["_extra"]["param_checksums"]
    print(f"rewards {rewards} checksums {sums}")
    print(f"SUMMARY wall_s={wall:.0f} recoveries={s['_extra']['recoveries']} spec={spec!r}")


if __name__ == "__main__":
    main()
