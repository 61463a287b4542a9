"""`rpeg calibrate RUN_DIR` fits this machine's efficiencies and fixed costs from a measured
timeline; the next prediction on that cluster uses them. The measured run here is written
by hand: every unit takes what the model prices at half its rates (work twice as long;
dispatch and gloo collectives unchanged) and the step 0.5 s more than its units."""

import json
from dataclasses import replace

import pytest

from rpeg.cli import main
from rpeg.compile.sources import resolve
from rpeg.config import RunConfig
from rpeg.perf.calibration import DEFAULT, SHIPPED, fit, machine_calibration
from rpeg.perf.prediction import Workload
from rpeg.perf.pricing import predict

CONFIG = "configs/builtin.yaml"


def _write_run(run, pred, factor=2.0, extra=0.5, steps=4, fixed=None):
    recs, hist = [], []
    for step in range(steps):
        t = 0.0
        for name, st in pred.stages.items():
            d = (fixed or {}).get(name, st.time_s * factor)
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
        slow = 5.0 if step == 0 else 0.0  # warm-up step, left out
        hist.append({"step": step + 1, "step_s": t + extra + slow})  # 1-based; timeline 0-based
    run.mkdir(parents=True, exist_ok=True)
    (run / "timeline.json").write_text(json.dumps({"records": recs}))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(h) for h in hist) + "\n")
    return hist


HALF = replace(SHIPPED, gen_eff_scale=0.5, train_eff_scale=0.5, fwd_eff_scale=0.5)


@pytest.fixture
def case():
    cfg = RunConfig.from_yaml(CONFIG)
    graph, plan = resolve(None, cfg)
    return cfg, graph, plan, Workload.from_config(cfg.workload)


def test_fit_recovers_the_scales_and_the_overhead(tmp_path, case):
    cfg, graph, plan, wl = case
    _write_run(tmp_path / "run", predict(graph, plan, wl, calib=HALF), factor=1.0)
    measured = fit.read_run(tmp_path / "run")
    assert measured.steps == 3  # the warm-up step is left out
    values, lines = fit.fit(lambda cal: predict(graph, plan, wl, calib=cal), measured)
    for k in ("gen_eff_scale", "train_eff_scale", "fwd_eff_scale"):
        if k in values:
            assert values[k] == pytest.approx(0.5, rel=1e-6)
    assert "gen_eff_scale" in values and "train_eff_scale" in values
    # measured step = 2 x (sum of units) + 0.5 s; the fitted units explain 2 x their share
    scaled = predict(graph, plan, wl, calib=SHIPPED.__class__(**{**SHIPPED.__dict__, **values}))
    assert scaled.step_s == pytest.approx(measured.step_s, rel=1e-6)


def test_fit_measures_the_rule_rewards_host_cost_per_sample(tmp_path, case):
    """The reward unit of the built-in config scores 128 samples; measured at 12.8 ms, the fit
    says 0.1 ms per sample, and the calibrated prediction prices the unit at that plus its
    dispatch (the generation, forward and training scales are fitted as before)."""
    cfg, graph, plan, wl = case
    samples = wl.samples
    assert samples == 128
    base = predict(graph, plan, wl, calib=SHIPPED)
    _write_run(tmp_path / "run", base, fixed={"reward": 0.0128})
    measured = fit.read_run(tmp_path / "run")
    values, lines = fit.fit(lambda cal: predict(graph, plan, wl, calib=cal), measured)
    assert values["fitted_host_per_sample_s"] == pytest.approx(1e-4, rel=1e-6)
    assert any("0.1 ms of host work per sample" in x for x in lines)
    cal = SHIPPED.__class__(**{**SHIPPED.__dict__, **values})
    st = predict(graph, plan, wl, calib=cal).stages["reward"]
    assert st.time_s - st.detail["dispatch_s"] == pytest.approx(0.0128, rel=1e-6)
    # a run without a separate reward unit (fused into generation) fits no host cost
    fused = {k: v for k, v in measured.unit_s.items() if k != "reward"}
    values, _ = fit.fit(
        lambda cal: predict(graph, plan, wl, calib=cal),
        fit.MeasuredRun(unit_s=fused, step_s=measured.step_s, steps=measured.steps),
    )
    assert "fitted_host_per_sample_s" not in values


def test_cli_calibrate_then_default_predictions_use_it(tmp_path, case, capsys):
    cfg, graph, plan, wl = case
    base = predict(graph, plan, wl, calib=SHIPPED)
    hist = _write_run(tmp_path / "run", predict(graph, plan, wl, calib=HALF), factor=1.0)
    out = tmp_path / "calibration.yaml"
    try:
        rc = main(["calibrate", str(tmp_path / "run"), "--config", CONFIG])
        assert rc == 0
        text = capsys.readouterr().out
        assert "gen_eff_scale=0.5" in text and plan.cluster in text
        cal = machine_calibration(plan.cluster)
        assert cal.train_eff_scale == pytest.approx(0.5, rel=1e-4)
        after = predict(graph, plan, wl)  # default calibration = this machine's
        measured = sorted(h["step_s"] for h in hist[1:])[1]
        assert abs(after.step_s - measured) < 0.02 * measured
        assert abs(base.step_s - measured) > 0.3 * measured  # it was off before
        assert predict(graph, plan, wl, calib=SHIPPED).step_s == pytest.approx(base.step_s)
    finally:
        from rpeg.perf.calibration import user_calibration_file

        user_calibration_file().unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    assert machine_calibration(plan.cluster) is DEFAULT


def test_run_folder_without_timeline_is_named(tmp_path):
    with pytest.raises(fit.RunDataError, match="timeline.json"):
        fit.read_run(tmp_path)


def test_fit_prices_the_run_at_its_measured_lengths(tmp_path, case):
    """A config that caps prompts at 32 tokens and states no mean is priced at 32-token
    prompts; the run's metrics say what the batches held (num_tokens per step, mean
    response length), and the fit prices the run at those lengths."""
    cfg, graph, plan, wl = case
    assert wl.mean_prompt_tokens == 32 and wl.mean_response_tokens is None
    base = predict(graph, plan, wl, calib=SHIPPED)
    hist = _write_run(tmp_path / "run", base)
    for i, h in enumerate(hist):  # 128 samples of 6 prompt + 3 response tokens (+ noise)
        h.update(num_tokens=128 * 9 + (i % 2) * 8, response_length=3.0 + 0.1 * (i % 2))
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(json.dumps(h) for h in hist))
    measured = fit.read_run(tmp_path / "run")
    at = fit.measured_workload(wl, measured)
    # medians over steps 1-3 (step 0 left out): tokens 1160, response 3.1
    assert at.mean_response_tokens == pytest.approx(3.1)
    assert at.mean_prompt_tokens == pytest.approx(1160 / 128 - 3.1)
    shorter = fit.predictor(graph, plan, wl, measured)(SHIPPED)
    assert shorter.stages["train_actor"].time_s < 0.5 * base.stages["train_actor"].time_s
    # a run folder without those metrics keeps the config's workload
    bare = fit.MeasuredRun(unit_s=measured.unit_s, step_s=measured.step_s, steps=3)
    assert fit.measured_workload(wl, bare) is wl


def test_metrics_step_counts_from_one_and_older_runs_still_read(tmp_path, case):
    """metrics.jsonl's ``step`` is an integer from 1 (the console's count); the timeline's
    ``step`` is the 0-based index. A run written before that change (``step`` a float from
    0) reads to the same measurement."""
    cfg, graph, plan, wl = case
    hist = _write_run(tmp_path / "run", predict(graph, plan, wl, calib=SHIPPED))
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    new = fit.read_run(tmp_path / "run")
    old = [dict(h, step=float(h["step"] - 1)) for h in hist]
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(json.dumps(h) for h in old))
    assert fit.read_run(tmp_path / "run") == new
    assert new.steps == 3  # steps 2-4 of the timeline's 1-3: an off-by-one join keeps 2


def test_cli_keeps_the_runs_lengths_for_later_predictions(tmp_path, case, capsys):
    """The run's batches held 6 prompt + 3 response tokens a sample, the longest response of
    a step 5: calibrate keeps them (and the spread that makes 5 the expected longest of 128
    samples) for the model and task; a later prediction from the same config uses them."""
    from rpeg.perf.calibration import run_lengths as RL
    from rpeg.perf.calibration import user_calibration_file

    cfg, graph, plan, wl = case
    hist = _write_run(tmp_path / "run", predict(graph, plan, wl, calib=HALF), factor=1.0)
    for h in hist:
        h.update(num_tokens=128 * 9, response_length=3.0, response_length_max=5.0)
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(json.dumps(h) for h in hist))
    try:
        assert main(["calibrate", str(tmp_path / "run"), "--config", CONFIG]) == 0
        assert "kept for later predictions of model=rpeg-tiny" in capsys.readouterr().out
        later = RL.configured_workload(cfg)
        assert later.mean_prompt_tokens == pytest.approx(6.0)
        assert later.mean_response_tokens == pytest.approx(3.0)
        from rpeg.perf.lengths import LengthDist

        spread = LengthDist(3.0, 16.0, later.length_sigma)
        assert spread.expected_max(128) == pytest.approx(5.0, rel=1e-3)
        assert later.assumed and str(tmp_path / "run") in later.assumed[0]
    finally:
        user_calibration_file().unlink(missing_ok=True)


def test_a_run_whose_longest_response_is_the_cap_is_priced_at_its_truncated_share(tmp_path, case):
    """Most steps decoded one response to the 16-token cap (0.6% of them cut there): the
    median longest is the cap, which bounds the spread only from below. The share cut says
    the rest: the run is priced at a spread whose longest of a step's 128 samples is the cap,
    so generate decodes to the cap (the calibrating run's spread would stop near 4 tokens)."""
    from rpeg.perf.lengths import LengthDist

    cfg, graph, plan, wl = case
    hist = _write_run(tmp_path / "run", predict(graph, plan, wl, calib=SHIPPED))
    for i, h in enumerate(hist):
        h.update(num_tokens=128 * 9, response_length=3.0, response_length_max=16.0)
        h["truncated_frac"] = (0.0, 0.0078125, 0.0078125, 0.0078125)[i]  # step 1 left out
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(json.dumps(h) for h in hist))
    measured = fit.read_run(tmp_path / "run")
    assert measured.truncated == pytest.approx(0.0078125)  # the mean: a rare event's median is 0
    at = fit.measured_workload(wl, measured)
    assert LengthDist(3.0, 16.0, at.length_sigma).expected_max(128) == 16.0
    narrow = replace(at, length_sigma=0.13)  # a spread whose longest of 128 is ~4 tokens
    assert LengthDist(3.0, 16.0, 0.13).expected_max(128) < 5.0
    gen = predict(graph, plan, at, calib=SHIPPED).stages["generate"].time_s
    assert gen > 1.5 * predict(graph, plan, narrow, calib=SHIPPED).stages["generate"].time_s
    # an older run folder without the truncated share keeps the calibration's spread
    bare = replace(measured, truncated=None)
    assert fit.measured_workload(wl, bare).length_sigma == wl.length_sigma


def test_warm_up_steps_beyond_skip_are_left_out():
    """Steps 2-3 of 8 still warming up (3.0 s against ~1 s after): the second half of the
    kept steps 2-8 is steps 5-8 at 1.1, 1.0, 0.9, 1.0 s, median 1.0; steps slower than 1.25 s
    at the start go, the first settled step (4, at 1.2 s) ends the warm-up."""
    times = {0: 5.0, 1: 3.0, 2: 3.0, 3: 1.2, 4: 1.1, 5: 1.0, 6: 0.9, 7: 1.0}
    assert fit.settled(set(range(1, 8)), times) == {3, 4, 5, 6, 7}
    # a run that is settled after its first step keeps everything after it
    even = {k: 1.0 + 0.01 * k for k in range(8)}
    assert fit.settled(set(range(1, 8)), even) == set(range(1, 8))
    # at least the second half stays, whatever the first half did
    slow_start = {0: 9.0, 1: 9.0, 2: 9.0, 3: 9.0, 4: 1.0, 5: 9.0, 6: 1.0, 7: 1.0}
    assert fit.settled(set(range(8)), slow_start) == {4, 5, 6, 7}


def test_the_step_overhead_comes_from_the_benchmarks_runtime_figure(tmp_path, case):
    """Given the runtime's own seconds per step (benchmarks/bench_overhead.py), the fitted
    step overhead is that figure less the dispatch the model prices on each unit -- not the
    residual of the step (here 0.5 s), which would carry the model's error on the units."""
    from rpeg.specs import cluster

    cfg, graph, plan, wl = case
    base = predict(graph, plan, wl, calib=HALF)
    _write_run(tmp_path / "run", base, factor=1.0)
    measured = fit.read_run(tmp_path / "run")
    assert len(base.stages) == 7  # the built-in chain: 7 units, each priced one dispatch
    dispatch = 7 * cluster(plan.cluster).dispatch_s
    values, lines = fit.fit(
        lambda cal: predict(graph, plan, wl, calib=cal), measured, runtime_s=0.2
    )
    assert values["fitted_step_overhead_s"] == pytest.approx(0.2 - dispatch, abs=1e-9)
    assert values["train_eff_scale"] == pytest.approx(0.5, rel=1e-6)  # fitted as before
    assert any("the runtime's own 200 ms per step (measured)" in x for x in lines)
    # less than the dispatch priced already: nothing more per step
    values, _ = fit.fit(lambda cal: predict(graph, plan, wl, calib=cal), measured, runtime_s=0.0)
    assert values["fitted_step_overhead_s"] == 0.0
    with pytest.raises(fit.RunDataError, match="runtime_s"):
        fit.fit(lambda cal: predict(graph, plan, wl, calib=cal), measured, runtime_s=-1.0)


def test_a_unit_measured_below_its_fixed_part_is_fitted_to_the_fixed_part(tmp_path, case):
    """A CPU run whose forward units took less than the collectives the model prices for
    them: the fit cannot explain them with a positive rate; it sets the class's scale to its
    bound (the units priced at their fixed part), not the shipped scale."""
    cfg, graph, plan, wl = case
    pred = predict(graph, plan, wl)
    fwd = [n for n, st in pred.stages.items() if fit._class(st.kinds) == "fwd"]
    assert fwd
    _write_run(tmp_path / "run", pred, fixed={n: 1e-6 for n in fwd})
    values, lines = fit.fit(
        lambda cal: predict(graph, plan, wl, calib=cal), fit.read_run(tmp_path / "run")
    )
    assert values["fwd_eff_scale"] == fit.SCALE_RANGE[1]
    assert any("fwd units: measured at or below" in line for line in lines)
    bound = predict(graph, plan, wl, calib=replace(SHIPPED, **values))
    # as close to the measured as the fixed part lets it be (a unit with no work, e.g. a
    # reused old_logprob, is its dispatch either way)
    assert sum(bound.stages[n].time_s for n in fwd) < sum(pred.stages[n].time_s for n in fwd)


def test_a_measured_collective_latency_prices_the_calls_a_pass_makes_and_is_kept(tmp_path, capsys):
    """`--collective-ms` (benchmarks/bench_collectives.py's SUMMARY on this machine) replaces
    the catalog's gloo call latency: a cp=2 plan's key/value gathers and per-tensor sums cost
    it per call from then on (the collectives are not scaled by the fitted efficiencies on
    CPU workers, so its comm moves by calls x the difference), and a later calibrate that
    does not measure it again keeps it. A negative figure is refused by name."""
    from rpeg.perf.calibration import user_calibration_file

    cfg = RunConfig.from_yaml("configs/cp2-cpu.yaml")
    graph, plan = resolve(None, cfg)
    wl = Workload.from_config(cfg.workload)
    catalog = predict(graph, plan, wl, calib=SHIPPED)
    _write_run(tmp_path / "run", catalog, factor=1.0)
    from rpeg import specs

    lat = specs.cluster(plan.cluster).collective_latency_s  # the catalog's (local-cpu)
    assert lat == pytest.approx(0.7e-3)
    measured = replace(SHIPPED, fitted_collective_latency_s=3 * lat)
    slower = predict(graph, plan, wl, calib=measured).stages["train_actor"].comm_s["domain"]
    base = catalog.stages["train_actor"].comm_s["domain"]
    twice = replace(SHIPPED, fitted_collective_latency_s=2 * lat)
    mid = predict(graph, plan, wl, calib=twice).stages["train_actor"].comm_s["domain"]
    assert slower > mid > base and slower - mid == pytest.approx(mid - base)  # per call
    try:
        args = ["calibrate", str(tmp_path / "run"), "--config", "configs/cp2-cpu.yaml"]
        assert main([*args, "--collective-ms", "2.1"]) == 0
        assert "collective call: 2.1 ms (measured)" in capsys.readouterr().out
        cal = machine_calibration(plan.cluster)
        assert cal.fitted_collective_latency_s == pytest.approx(3 * lat)
        after = predict(graph, plan, wl).stages["train_actor"].comm_s["domain"]
        assert after == pytest.approx(slower)
        assert main(args) == 0  # measured once, kept
        assert machine_calibration(plan.cluster).fitted_collective_latency_s == pytest.approx(
            2.1e-3
        )
        with pytest.raises(fit.RunDataError, match="collective_s"):
            fit.fit(lambda c: catalog, fit.read_run(tmp_path / "run"), collective_s=-1.0)
    finally:
        user_calibration_file().unlink(missing_ok=True)
