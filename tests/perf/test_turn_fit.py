"""`rpeg calibrate RUN` of a multi-turn run fits the turn shape the performance model takes
as input (mean turns, tokens per turn and per observation, environment latency) from the
run's metrics.jsonl, prices the run at it for the efficiency fit, and prints it as the
task.multiturn values to set. Metrics written by hand; expected values worked by hand."""

import json

import pytest

from rpeg.perf.calibration import turn_fit
from rpeg.perf.turns import Turns

TURNS = Turns(max_turns=3, max_turn_tokens=28, env_concurrency=8)

#: three measured steps (the warm-up step before them is left out by `rpeg calibrate`)
STEPS = [
    {"turns_mean": 1.5, "turn_tokens_mean": 20.0, "observation_tokens_mean": 12.0, "env_s": 0.012},
    {"turns_mean": 2.0, "turn_tokens_mean": 24.0, "observation_tokens_mean": 14.0, "env_s": 0.020},
    {"turns_mean": 1.75, "turn_tokens_mean": 22.0, "env_s": 0.015},  # no observation figure
]


def test_fitted_turn_shape_by_hand():
    """24 samples per rollout process, 8 calls at once: the resets take ceil(24/8) = 3 waves.
    Step 1 (1.5 turns): 3 + 3 (turn 1, all 24) + ceil(12/8) = 2 (turn 2, half) = 8 waves,
    0.012 / 8 = 1.5 ms. Step 2 (2 turns): 3 + 3 + 3 = 9 waves, 0.020 / 9 = 2.22 ms. Step 3
    (1.75 turns): 3 + 3 + ceil(18/8) = 3 -> 9 waves, 0.015 / 9 = 1.67 ms. Medians: 1.75
    turns, 22 tokens per turn, 13 observation tokens (of the two steps that had one),
    1.67 ms per call."""
    m = turn_fit.measured_turns(STEPS)
    t, lines = turn_fit.fitted_turns(TURNS, m, samples_per_process=24)
    assert t.mean_turns == 1.75
    assert t.mean_turn_tokens == 22.0
    assert t.observation_tokens == 13.0
    assert t.env_latency_s == pytest.approx(0.015 / 9)
    assert t.max_turns == 3 and t.env_concurrency == 8  # the caps stay the config's
    assert lines[0] == "mean_turns 1.75: median turns_mean over 3 steps"
    assert turn_fit.config_lines(t, 45.5) == [
        "task.multiturn.mean_turns: 1.75",
        "task.multiturn.mean_turn_tokens: 22",
        "task.multiturn.observation_tokens: 13",
        "task.multiturn.env_latency_s: 0.001667",
        "workload.mean_response_tokens: 45.5",
    ]


def test_means_are_kept_within_the_caps_and_missing_figures_keep_the_config():
    # a run with more turns than a later config allows, and turn tokens past its cap
    rows = [{"turns_mean": 3.4, "turn_tokens_mean": 40.0}]
    t, lines = turn_fit.fitted_turns(TURNS, turn_fit.measured_turns(rows), 24)
    assert t.mean_turns == 3.0 and t.mean_turn_tokens == 28.0
    # no observation and no env_s figure: the configured values stay (16 tokens, 0.01 s)
    assert t.observation_tokens == TURNS.observation_tokens
    assert t.env_latency_s == TURNS.env_latency_s
    assert any("observation_tokens: no step appended" in x for x in lines)
    assert any("env_latency_s: no env_s" in x for x in lines)
    # a single-turn run's metrics: nothing to fit
    assert turn_fit.measured_turns([{"step": 1, "response_length": 3.0}]) is None


def _write_run(run, pred, steps):
    """Every unit at twice its predicted time; metrics.jsonl with the turn figures."""
    recs, hist = [], []
    for step, figures in enumerate(steps):
        t = 0.0
        for name, st in pred.stages.items():
            d = st.time_s * 2.0
            recs.append(
                {
                    "stage": name,
                    "device_group": st.devices,
                    "start_s": t,
                    "end_s": t + d,
                    "step": step,
                    "source": "measured",
                }
            )
            t += d
        # 48 samples of 26 prompt + 45.5 transcript tokens
        hist.append(
            {
                "step": step + 1,
                "step_s": t + 0.5,
                "num_tokens": 48 * (26 + 45.5),
                "response_length": 45.5,
                **figures,
            }
        )
    run.mkdir(parents=True, exist_ok=True)
    (run / "timeline.json").write_text(json.dumps({"records": recs}))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(h) for h in hist) + "\n")


def test_cli_calibrate_of_a_multiturn_run_prints_the_turn_shape(tmp_path, capsys):
    """configs/tool-cpu.yaml on 2 data-parallel ranks: 48 samples, 24 per rollout process
    (the plan's, read off the env stage), so the hand-worked values above. The shape is
    printed as config values and kept for later predictions of the same model and task,
    which take it where their config states none."""
    from rpeg.cli import main
    from rpeg.compile.sources import resolve
    from rpeg.config import RunConfig
    from rpeg.perf.calibration import SHIPPED, user_calibration_file
    from rpeg.perf.calibration.run_lengths import configured_workload
    from rpeg.perf.prediction import Workload
    from rpeg.perf.pricing import predict

    cfg = RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {"task.multiturn.max_turns": 3, "cluster.num_devices": 2, "cluster.n_workers": 2}
    )
    path = tmp_path / "tool.yaml"
    path.write_text(cfg.to_yaml())
    graph, plan = resolve(None, cfg)
    wl = Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)
    pred = predict(graph, plan, wl, calib=SHIPPED)
    assert turn_fit.samples_per_process(pred) == 24
    warm = {"turns_mean": 3.0, "turn_tokens_mean": 28.0, "env_s": 9.0}  # left out
    _write_run(tmp_path / "run", pred, [warm, *STEPS])
    try:
        assert main(["calibrate", str(tmp_path / "run"), "--config", str(path)]) == 0
        out = capsys.readouterr().out
        assert "turns: mean_turns 1.75: median turns_mean over 3 steps" in out
        for line in (
            "  task.multiturn.mean_turns: 1.75",
            "  task.multiturn.mean_turn_tokens: 22",
            "  task.multiturn.observation_tokens: 13",
            "  task.multiturn.env_latency_s: 0.001667",
            "  workload.mean_response_tokens: 45.5",
            "  workload.mean_prompt_tokens: 26",
        ):
            assert line in out.splitlines(), (line, out)
        stored = user_calibration_file().read_text()
        assert "gen_eff_scale" in stored and "mean_turns: 1.75" in stored
        later = configured_workload(cfg, plan.cluster)  # rpeg predict / bench of the task
        t = later.turns
        assert (t.mean_turns, t.mean_turn_tokens, t.observation_tokens) == (1.75, 22.0, 13.0)
        assert t.env_latency_s == pytest.approx(0.015 / 9, rel=1e-3)  # rounded to 6 places
        assert later.mean_prompt_tokens == 26.0 and later.mean_response_tokens == 45.5
        assert (
            predict(graph, plan, later)
            .assumptions[0]
            .startswith(
                f"turn shape measured by rpeg calibrate on {tmp_path / 'run'}: mean_turns 1.75"
            )
        )
        # calibrating again (a single-turn run or another task) keeps the stored shape
        assert main(["calibrate", str(tmp_path / "run"), "--config", str(path)]) == 0
        assert "mean_turns: 1.75" in user_calibration_file().read_text()
    finally:
        user_calibration_file().unlink(missing_ok=True)


def test_a_multiturn_run_is_repriced_at_the_turn_shape_it_measured(tmp_path):
    """What `rpeg bench` prices a finished run at (fit.run_workload): the turns it measured
    (the hand-worked 1.75 turns of 22 tokens, 13-token observations) and its lengths, not
    the config's shape (2 turns of up to 28 tokens)."""
    from rpeg.compile.sources import resolve
    from rpeg.config import RunConfig
    from rpeg.perf.calibration import SHIPPED, fit
    from rpeg.perf.prediction import Workload
    from rpeg.perf.pricing import predict

    cfg = RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {"task.multiturn.max_turns": 3, "cluster.num_devices": 2, "cluster.n_workers": 2}
    )
    graph, plan = resolve(None, cfg)
    wl = Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)
    pred = predict(graph, plan, wl, calib=SHIPPED)
    _write_run(tmp_path / "run", pred, [STEPS[0], *STEPS])
    measured = fit.read_run(tmp_path / "run")
    at = fit.run_workload(graph, plan, wl, measured)
    t = at.turns
    assert (t.mean_turns, t.mean_turn_tokens, t.observation_tokens) == (1.75, 22.0, 13.0)
    assert at.mean_response_tokens == 45.5 and at.mean_prompt_tokens == 26.0
    # a single-turn run's workload gets its lengths alone
    plain = Workload.from_config(RunConfig().workload)
    assert fit.run_workload(graph, plan, plain, measured) == fit.measured_workload(plain, measured)
