"""After a resume the summary and timeline.json cover the whole run (issue 28 low probe: they
covered only the last call), and a run with nothing held out says so (it printed
``nan -> nan``)."""

from __future__ import annotations

import json

from rpeg.runtime.summary import heldout_phrase, resumed_timeline, run_summary


def _hist(times):
    return [{"step": i + 1, "reward_mean": 0.5, "step_s": t} for i, t in enumerate(times)]


def test_wall_s_after_a_resume_adds_the_restored_steps():
    # steps 1-2 ran in an earlier call (3 s + 4 s); this call ran step 3 and took 10 s in all
    s = run_summary(
        _hist([3.0, 4.0, 2.0]), wall_s=10.0, acc_before=0.1, acc_after=0.2, resumed_at=2
    )
    assert s["wall_s"] == 17.0 and s["segment_wall_s"] == 10.0
    fresh = run_summary(_hist([3.0, 4.0, 2.0]), wall_s=10.0, acc_before=0.1, acc_after=0.2)
    assert fresh["wall_s"] == 10.0 == fresh["segment_wall_s"]


def test_the_timeline_keeps_the_restored_steps_of_the_earlier_call(tmp_path):
    path = tmp_path / "timeline.json"
    earlier = {
        "records": [
            {"step": 0, "stage": "a"},
            {"step": 1, "stage": "a"},
            {"step": 2, "stage": "a"},
        ],
        "step_offsets_s": {"0": 1.0, "1": 5.0, "2": 9.0},
        "stage_spans": [{"step": 1, "stage": "gen"}, {"step": 2, "stage": "gen"}],
    }
    path.write_text(json.dumps(earlier))
    # checkpoint after step index 1 (two steps restored); step index 2 is run again
    now = {
        "records": [{"step": 2, "stage": "b"}],
        "step_offsets_s": {"2": 0.5},
        "stage_spans": [{"step": 2, "stage": "gen2"}],
    }
    got = resumed_timeline(path, now, resumed_at=2)
    assert got["records"] == [
        {"step": 0, "stage": "a"},
        {"step": 1, "stage": "a"},
        {"step": 2, "stage": "b"},
    ]
    assert got["step_offsets_s"] == {"0": 1.0, "1": 5.0, "2": 0.5}
    assert got["stage_spans"] == [{"step": 1, "stage": "gen"}, {"step": 2, "stage": "gen2"}]
    assert got["segments"] == [0, 2]
    # a fresh run ignores an old file
    assert resumed_timeline(path, now, resumed_at=0)["records"] == now["records"]
    # a missing or broken earlier file: this call's alone
    path.write_text("{not json")
    assert resumed_timeline(path, now, resumed_at=2)["records"] == now["records"]


def test_no_held_out_rows_is_said_in_words():
    assert heldout_phrase({"heldout_acc_before": 0.25, "heldout_acc_after": 0.5}) == (
        "held-out greedy accuracy 0.250 -> 0.500"
    )
    nan = float("nan")
    got = heldout_phrase({"heldout_acc_before": nan, "heldout_acc_after": nan})
    assert "nan" not in got and got.startswith("no held-out accuracy (the held-out set is empty")
