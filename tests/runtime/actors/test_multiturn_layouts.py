"""A multi-turn run samples the same transcripts on any layout: the distributed runtime with
generation split over two data-parallel ranks writes, row for row, the single-process
trainer's samples (turn t of the step's row j seeded by j and t only,
rpeg.runtime.engines.row_sampling.turn_seed). Before, a later turn's rows were seeded by
their position among the rows still going in their rank's part, so a rank whose first rows
had finished in turn 1 sampled other second turns than the single process did."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

STEPS = 2


def _cfg(path):
    from rpeg.config import RunConfig

    return RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {
            # the resume test's short warm-up (every transcript calls the tool): most samples
            # take a second turn, some end in the first (cached by config hash)
            "optim.warmup_sft_steps": 30,
            "optim.warmup_sft_batch_size": 16,
            "task.multiturn.warmup_tool_share": 1.0,
            "task.heldout_size": 2,
            "workload.num_prompts": 4,  # 16 rows: rank 0 generates rows 0-7, rank 1 8-15
            "workload.samples_per_prompt": 4,
            "workload.train_minibatches": 1,
            "runtime.steps": STEPS,
            "runtime.max_staleness": 0,
            "runtime.log_samples_every": 1,
            "runtime.output_dir": str(path),
            "cluster.num_devices": 2,
            "cluster.n_workers": 2,
        }
    )


def _samples(path):
    rows = [json.loads(x) for x in (path / "samples.jsonl").read_text().splitlines()]
    return {(int(r["step"]), int(r["index"])): r["response"] for r in rows}


def test_two_generating_ranks_sample_the_single_process_transcripts(
    tmp_path, prefect_harness, dask_cluster
):
    from rpeg.flows.entry import train_on

    from rpeg.compile import compile_plan
    from rpeg.runtime.local_trainer import LocalTrainer

    dist_cfg = _cfg(tmp_path / "dist")
    gen = compile_plan(None, dist_cfg).group(compile_plan(None, dist_cfg).rollout_group)
    assert gen.dp == 2  # generation split over two data-parallel ranks
    LocalTrainer(_cfg(tmp_path / "local").with_overrides({"cluster.num_devices": 1})).run()
    train_on(dask_cluster, dist_cfg, progress=False)
    local, dist = _samples(tmp_path / "local"), _samples(tmp_path / "dist")
    assert sorted(local) == sorted(dist) == [(s, i) for s in (1, 2) for i in range(16)]

    def second_turn(s, i):  # an observation was appended: the tool's result or its refusal
        return "</result>" in local[(s, i)] or "<error>" in local[(s, i)]

    # the case the old seeding got wrong: in a step a row of rank 0's part ended in turn 1
    # and a row of rank 1's part took a second turn (seeded by its place among the rows
    # still going: 8 + j on rank 1, fewer than 8 + j in the single process)
    for s in (1, 2):
        assert not all(second_turn(s, i) for i in range(8))
        assert any(second_turn(s, i) for i in range(8, 16))
    for key in sorted(local):
        assert dist[key] == local[key], key
