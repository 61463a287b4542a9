"""Issue 31 item 6: a multi-turn run at k = 1 (rollout and training on separate workers)
stopped after a step's checkpoint and resumed, and one whose generator is killed inside an
environment step of turn 2, reach the uninterrupted run's metrics: the checkpointed buffer
holds finished multi-turn samples with everything they carry (the transcript, the loss mask
with its holes, the attention over observations, the tool metrics), and the interrupted
rollout is regenerated from its seed and counted (docs/faults.md "Multi-turn runs")."""

from __future__ import annotations

import json

import pytest

from rpeg.runtime.actors.fault_points import arm

pytestmark = pytest.mark.slow

KEYS = (
    "reward_mean",
    "entropy",
    "kl",
    "grad_norm",
    "pg_loss",
    "response_length",
    "tool_use_rate",
    "tool_calls_mean",
    "turns_mean",
    "env_errors",
)
STEPS = 3


class Stop(Exception):
    """The process 'dies' right after a checkpoint (not a lost worker: no recovery)."""


def _cfg(path, **over):
    from rpeg.config import RunConfig

    return RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {
            # a short warm-up that calls the tool in every transcript: most samples have
            # a second turn, some end in the first (cached by config hash after one run)
            "optim.warmup_sft_steps": 30,
            "optim.warmup_sft_batch_size": 16,
            "task.multiturn.warmup_tool_share": 1.0,
            "task.heldout_size": 2,
            # rewards that vary within a group (the tiny model rarely answers right yet): a
            # length penalty over the model's own tokens (DAPO's soft overlong window from 0)
            "algorithm.overlong_penalty_tokens": 64,
            "workload.num_prompts": 2,
            "workload.samples_per_prompt": 4,
            "workload.train_minibatches": 1,
            "runtime.steps": STEPS,
            "runtime.max_staleness": 1,
            "runtime.checkpoint_every": 1,
            "runtime.checkpoint_url": str(path / "ck"),
            "runtime.output_dir": str(path / "out"),
            "cluster.num_devices": 2,
            "cluster.n_workers": 2,
            **over,
        }
    )


def _run(cfg, cluster, **kw):
    from rpeg.flows.entry import train_on

    return train_on(cluster, cfg, progress=False, **kw)


def _same(a, b):
    assert int(a["step"]) == int(b["step"])
    assert a["staleness_max"] == b["staleness_max"], (a["step"], a["staleness_max"])
    for k in KEYS:
        assert k in a and k in b, k
        assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k, a[k], b[k])


def _lines(path):
    return [
        int(json.loads(x)["step"])
        for x in (path / "out" / "metrics.jsonl").read_text().splitlines()
    ]


def _logged(path):
    """samples.jsonl: (step, sample index) of every row."""
    rows = [json.loads(x) for x in (path / "out" / "samples.jsonl").read_text().splitlines()]
    return sorted((int(r["step"]), int(r["index"])) for r in rows)


#: every step's 8 samples (2 prompts x 4) logged once
ONCE = [(s, i) for s in range(1, STEPS + 1) for i in range(8)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, prefect_harness, dask_cluster):
    p = tmp_path_factory.mktemp("full")
    return _run(_cfg(p), dask_cluster)


def test_a_multiturn_k1_run_stopped_after_step_n_and_resumed_reaches_the_same_metrics(
    tmp_path, uninterrupted, prefect_harness, dask_cluster
):
    full = uninterrupted["_extra"]["history"]
    assert [h["staleness_max"] for h in full] == [0.0, 1.0, 1.0]
    # the rollouts are multi-turn: some samples took a second turn
    assert all(1.0 < h["turns_mean"] <= 2.0 for h in full), [h["turns_mean"] for h in full]
    cfg = _cfg(tmp_path)

    def stop(run, step):
        if step == 2:
            raise Stop("stopped after the step-2 checkpoint")

    with pytest.raises(Stop):
        _run(cfg, dask_cluster, fault_hook=stop)
    res = _run(cfg, dask_cluster, resume=True)
    assert res["steps_run"] == 1  # step 3, from the buffered rollout of the checkpoint
    hist = res["_extra"]["history"]
    assert res["steps"] == STEPS and [h["step"] for h in hist] == [1, 2, 3]
    for a, b in zip(full, hist, strict=True):
        _same(a, b)
    assert _lines(tmp_path) == [1, 2, 3]  # no line without a step, none twice
    assert _logged(tmp_path) == ONCE
    assert res["_extra"]["param_checksums"] == pytest.approx(
        uninterrupted["_extra"]["param_checksums"], rel=1e-6
    )


def test_a_generator_killed_in_an_env_step_of_turn_2_recovers_to_the_same_metrics(
    tmp_path, uninterrupted, prefect_harness, dask_cluster
):
    """The generator's process ends as the environment steps of turn 2 begin in the
    rollout for step 3 (slot 2, generated while step 2 trains; its samples half-finished).
    The recovery goes back to the checkpoint after step 1, whose buffer holds step 2's
    rollout (a multi-turn batch restored from the file), trains step 2 again and generates
    step 3's rollout again from its seeds: 8 samples (2 prompts x 4)."""
    from rpeg.compile import compile_plan

    full = uninterrupted["_extra"]["history"]
    assert uninterrupted["recoveries"] == 0 and uninterrupted["regenerated_samples"] == 0
    cfg = _cfg(tmp_path)
    gen = compile_plan(None, cfg).rollout_group
    once = tmp_path / "fired"
    spec = f"group={gen} rank=0 phase=env step=2 turn=2 once={once}"
    arm(spec)  # here too: a replacement spawned by a nanny inherits this environment
    dask_cluster.client.run(arm, spec)
    try:
        res = _run(cfg, dask_cluster)
    finally:
        arm(None)
        dask_cluster.client.run(arm, None)
    assert once.exists(), "the env fault point never fired"
    assert once.read_text().startswith(f"{gen} 0 env 2 2 pid=")  # in step 3's rollout, turn 2
    assert res["recoveries"] == 1 and res["_extra"]["recoveries"] == 1
    assert res["regenerated_samples"] == 8
    hist = res["_extra"]["history"]
    assert res["steps"] == STEPS and [h["step"] for h in hist] == [1, 2, 3]
    for a, b in zip(full, hist, strict=True):
        _same(a, b)
    assert _lines(tmp_path) == [1, 2, 3]
    assert _logged(tmp_path) == ONCE
    assert res["_extra"]["param_checksums"] == pytest.approx(
        uninterrupted["_extra"]["param_checksums"], rel=1e-6
    )


class Interrupted(BaseException):
    """The single-process trainer 'dies' mid-rollout (a BaseException: nothing catches it)."""


def test_local_k1_run_interrupted_mid_rollout_and_resumed_reaches_the_same_metrics(
    tmp_path, monkeypatch
):
    """``rpeg train --local --resume`` at k = 1: the local trainer generates with a lagging
    engine copy (no buffer); its checkpoint holds that copy's weights. Interrupted as turn
    2's environment steps of step 2 begin (a rollout from the copy one version behind),
    resumed from the step-1 checkpoint: step 2 is generated again from its seed with the
    copy's weights, and every step matches the uninterrupted run."""
    from rpeg.runtime.envs import rollout
    from rpeg.runtime.local_trainer import LocalTrainer

    over = {"cluster.num_devices": 1}
    full = LocalTrainer(_cfg(tmp_path / "full", **over)).run()
    ref = [json.loads(x) for x in (tmp_path / "full/out/metrics.jsonl").read_text().splitlines()]
    # the engine copy lags: steps 1, 2 from version 0, step 3 from version 2 (lags 0, 1, 0)
    assert full["steps"] == STEPS and [h["staleness_lag_max"] for h in ref] == [0.0, 1.0, 0.0]
    cfg = _cfg(tmp_path, **over)
    first = LocalTrainer(cfg)
    turns = []

    def die(turn):
        turns.append((first.step_index, turn))
        if first.step_index == 1 and turn == 2:
            raise Interrupted("mid-rollout of step 2")

    monkeypatch.setattr(rollout, "env_turn", die)
    with pytest.raises(Interrupted):
        first.run()
    monkeypatch.undo()
    assert turns[-1] == (1, 2)
    res = LocalTrainer(cfg.with_overrides({"runtime.resume": True})).run()
    got = [json.loads(x) for x in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    assert res["steps_run"] == 2  # steps 2 and 3: step 1 came from the checkpoint
    assert res["steps"] == STEPS and [h["step"] for h in got] == [1, 2, 3]
    assert _logged(tmp_path) == ONCE
    for a, b in zip(ref, got, strict=True):
        for k in KEYS:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k, a[k], b[k])
