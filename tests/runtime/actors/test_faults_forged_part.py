"""Issue 44, item 7 on the distributed runtime: a rank part holding another model's weights
under a forged checksum is named and the previous checkpoint is loaded."""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest
import torch

from rpeg.runtime.actors.checkpoint import COMMIT, dumps, loads

pytestmark = pytest.mark.slow


def _forge_rank_parts(step_dir) -> list[str]:
    commit = json.loads((step_dir / COMMIT).read_text())
    forged = []
    for name in sorted(commit["files"]):
        if "-rank" not in name:
            continue
        st = loads((step_dir / name).read_bytes())
        actor = st.get("actor")
        if not isinstance(actor, dict) or "module" not in actor:
            continue
        for k in list(actor["module"])[:3]:
            actor["module"][k] = torch.zeros(7, 5)
        data = dumps(st)
        (step_dir / name).write_bytes(data)
        commit["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        forged.append(name)
    (step_dir / COMMIT).write_text(json.dumps(commit))
    return forged


def test_a_forged_rank_part_falls_back_to_the_previous_checkpoint(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    from rpeg.flows.entry import train_on

    first = make_config(
        tmp_path,
        **{
            "runtime.steps": 2,
            "runtime.checkpoint_url": str(tmp_path / "ck"),
            "runtime.checkpoint_every": 1,
            "runtime.run_id": "run-d",
        },
    )
    train_on(dask_cluster, first, progress=False)
    assert _forge_rank_parts(tmp_path / "ck" / "run-d" / "step-00000002")
    second = first.with_overrides({"runtime.steps": 3})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s = train_on(dask_cluster, second, progress=False, resume=True)
    said = [str(w.message) for w in seen if "does not load" in str(w.message)]
    assert said and "step-00000002" in said[0] and "does not fit" in said[0]
    assert "falling back to checkpoint step 1" in said[0]
    assert s["steps_run"] == 2  # steps 2 and 3, from step 1's checkpoint
