"""The single-process loop (LocalTrainer.run, what ``train(config, local=True)`` and the
retrain flow's ``local`` engine run) appends metrics.jsonl step by step (issue 28: rewritten
whole every step) and accumulates wall_s over a resume through the one entry."""

from __future__ import annotations

import json

import pytest

from rpeg.config import RunConfig


def _cfg(tmp_path, steps):
    return RunConfig.from_dict(
        {
            "workload": {"num_prompts": 2, "samples_per_prompt": 2, "max_response_tokens": 4},
            "optim": {"warmup_sft_steps": 0},
            "task": {"heldout_size": 2},
            "runtime": {
                "steps": steps,
                "output_dir": str(tmp_path / "out"),
                "checkpoint_url": str(tmp_path / "ck"),
                "checkpoint_every": 1,
            },
        }
    )


@pytest.mark.slow  # two short local runs: ~60 s on the loaded 2-core machine
def test_metrics_are_appended_and_a_resume_adds_up(tmp_path):
    from rpeg.flows.entry import train_on

    from rpeg.runtime.local_trainer import LocalTrainer

    path = tmp_path / "out" / "metrics.jsonl"

    def mark(step, total, m):  # a rewrite would restore line 1, an append keeps the mark
        if step == 1:
            path.write_text(path.read_text().replace('"step": 1', '"step": 7'))

    trainer = LocalTrainer(_cfg(tmp_path, 2))
    first = trainer.run(on_step=mark)
    steps = [json.loads(x)["step"] for x in path.read_text().splitlines()]
    assert steps == [7, 2]
    second = train_on(None, _cfg(tmp_path, 3), local=True, resume=True, progress=False)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]
    hist = second["_extra"]["history"]
    assert second["wall_s"] == second["segment_wall_s"] + sum(h["step_s"] for h in hist[:2])
    assert first["steps"] == 2 and second["steps"] == 3
