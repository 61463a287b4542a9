"""The driver's timeline keeps a pipelined trainer's actions per rank with their receive
waits, relative to the run's origin, for the newest PIPELINE_ACTION_STEPS steps only (a long
run's actions would otherwise grow timeline.json by thousands of entries per step)."""

from __future__ import annotations

import pytest

from rpeg.runtime.actors.recorder import PIPELINE_ACTION_STEPS, TimelineRecorder
from rpeg.runtime.actors.unit_result import PipelineAction


def test_actions_are_kept_per_rank_relative_to_the_origin_for_the_newest_steps():
    rec = TimelineRecorder()
    t = rec.origin_wall
    for step in range(PIPELINE_ACTION_STEPS + 2):
        for rank in (0, 1):
            acts = [
                PipelineAction("F", rank, 0, t + step + 0.1, t + step + 0.2, 0.05),
                PipelineAction("B", rank, 0, t + step + 0.3, t + step + 0.5),
            ]
            rec.add_pipeline_actions(step, "train_actor", rank, acts)
    kept = rec.pipeline_actions
    steps = sorted({a["step"] for a in kept})
    assert steps == list(range(2, PIPELINE_ACTION_STEPS + 2))
    assert len(kept) == 4 * PIPELINE_ACTION_STEPS
    last = [a for a in kept if a["step"] == PIPELINE_ACTION_STEPS + 1 and a["rank"] == 1]
    assert [(a["kind"], a["chunk"], a["micro"]) for a in last] == [("F", 1, 0), ("B", 1, 0)]
    first = last[0]
    assert first["start_s"] == pytest.approx(PIPELINE_ACTION_STEPS + 1.1, abs=1e-5)
    assert first["end_s"] == pytest.approx(PIPELINE_ACTION_STEPS + 1.2, abs=1e-5)
    assert (first["wait_s"], last[1]["wait_s"]) == (0.05, 0.0)
    assert first["unit"] == "train_actor"
