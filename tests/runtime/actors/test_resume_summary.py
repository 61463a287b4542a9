"""A distributed run stopped after step 2 and resumed to step 4: the summary's ``wall_s`` and
``timeline.json`` cover the whole run, not only the second call (issue 28 low probe)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_a_resumed_run_reports_its_whole_wall_time_and_timeline(
    tmp_path, prefect_harness, dask_cluster, make_config
):
    from rpeg.flows.entry import train_on

    first = make_config(
        tmp_path,
        **{
            "runtime.steps": 2,
            "runtime.checkpoint_url": str(tmp_path / "ck"),
            "runtime.checkpoint_every": 1,
        },
    )
    train_on(dask_cluster, first, progress=False)
    out = tmp_path / "out"
    steps_first = {r["step"] for r in json.loads((out / "timeline.json").read_text())["records"]}
    assert steps_first == {0, 1}
    second = first.with_overrides({"runtime.steps": 4})
    s = train_on(dask_cluster, second, progress=False, resume=True)
    hist = s["_extra"]["history"]
    restored = sum(h["step_s"] for h in hist[:2])
    assert s["steps_run"] == 2
    assert s["wall_s"] == pytest.approx(s["segment_wall_s"] + restored)
    timeline = json.loads((out / "timeline.json").read_text())
    assert {r["step"] for r in timeline["records"]} == {0, 1, 2, 3}
    assert timeline["segments"] == [0, 2]
    assert sorted(int(k) for k in timeline["step_offsets_s"]) == [0, 1, 2, 3]
