"""Leave-one-source-out validation, system factors and conformal ranges (rpeg.perf.validation.loso,
rpeg.perf.systems), on hand-built rows whose step time is a known function of the factors."""

import csv
import math
from dataclasses import replace

import numpy as np
import pytest

from rpeg.perf.systems import POOLED, SYSTEMS, SystemParams, normalise, system_params
from rpeg.perf.validation import loso, loso_fit, loso_ranges
from rpeg.perf.validation.loso import GRID, Priced
from rpeg.perf.validation.loso_lengths import LEN_GRID, at
from rpeg.perf.validation.loso_summary import Scored, summarise


def _row(case, source, system, gen_s, train_s, true_g=1.0, true_t=1.0, stages=False):
    """A row whose modelled step is gen/g + train/t (a synchronous step), measured at the
    true factors; its mean length is published (one point on the length axis)."""
    grid = np.array([[[gen_s / g + train_s / t for t in GRID] for g in GRID]])
    meas = gen_s / true_g + train_s / true_t
    return Priced(
        case_id=case,
        source=source,
        system=system,
        dataset="synthetic",
        measured_s=meas,
        measured_tput=None,
        step=grid,
        tokens_per_step=np.array([1e6]),
        stage_pred={"generate": np.array([gen_s]), "train_actor": np.array([train_s])},
        stage_meas=(
            {"generate": gen_s / true_g, "train_actor": train_s / true_t} if stages else {}
        ),
        unknown_lo=0.0,
        unknown_hi=0.0,
    )


def _set(system="sys-a", g=0.5, t=2.0, sources=3, per=8):
    rows = []
    for s in range(sources):
        for i in range(per):
            gen, train = 10.0 + 7 * i, 50.0 - 5 * i  # both stages vary: g and t separate
            rows.append(_row(f"{system}-{s}-{i}", f"src{s}", system, gen, train, g, t))
    return rows


def test_fit_recovers_the_factors_of_a_system(monkeypatch):
    monkeypatch.setattr(loso_fit, "SHRINK", 1e-6)
    fitted = loso.fit(_set(g=0.5, t=2.0))
    g, t = (math.exp(v) for v in fitted["sys-a"])
    assert g == pytest.approx(0.5, rel=0.04) and t == pytest.approx(2.0, rel=0.04)


def test_shrinkage_pulls_a_thin_system_towards_the_pooled_factors(monkeypatch):
    monkeypatch.setattr(loso_fit, "SHRINK", 2.0)
    rows = _set("big", g=1.0, t=1.0, sources=4, per=10) + [
        _row("thin-0", "src-thin", "thin", 10.0, 10.0, 0.5, 0.5)
    ]
    f = loso.fit(rows)
    g_thin = math.exp(f["thin"][0])
    # one row says 0.5, the pooled factors say ~1: the estimate lies between
    assert 0.5 < g_thin < 0.95


def test_a_sources_own_measurements_never_move_its_loso_prediction():
    rows = _set("sys-a", g=0.7, t=1.3) + _set("sys-b", g=1.2, t=0.8, sources=2)
    base = {s.case_id: s for s in loso.score(rows)}
    moved = [
        Priced(**{**vars(p), "measured_s": p.measured_s * 3.0}) if p.source == "src0" else p
        for p in rows
    ]
    after = {s.case_id: s for s in loso.score(moved)}
    for p in rows:
        if p.source == "src0":
            assert after[p.case_id].pred_loso == pytest.approx(base[p.case_id].pred_loso)
    # the in-sample fit does see them
    assert any(
        after[p.case_id].pred_in != pytest.approx(base[p.case_id].pred_in)
        for p in rows
        if p.source == "src0"
    )


def test_a_system_seen_only_in_the_scored_source_takes_the_pooled_prior():
    rows = _set("sys-a", sources=3) + [_row("lonely", "src-new", "sys-new", 20.0, 20.0, 0.4, 0.4)]
    (s,) = [x for x in loso.score(rows) if x.case_id == "lonely"]
    assert not s.system_fitted
    assert s.hi_loso / s.pred_loso > 1.0


def test_conformal_half_width_is_the_ceil_n_plus_1_quantile_of_abs_residuals(monkeypatch):
    monkeypatch.setattr(loso_ranges, "ALPHA", 0.2)
    # n = 5, alpha = 0.2: the ceil(6 * 0.8) = 5th smallest |r| = 0.4
    lo, hi = loso_ranges.conformal_range([0.1, -0.2, 0.3, 0.05, -0.4], 1.0)
    assert (lo, hi) == pytest.approx((-0.4, 0.4))
    # n = 10: the ceil(11 * 0.8) = 9th smallest of 0.1 .. 1.0 = 0.9; widened 1.5x
    lo, hi = loso_ranges.conformal_range([0.1 * k for k in range(1, 11)], 1.5)
    assert hi == pytest.approx(0.9 * 1.5)
    # alpha 0.15: ceil(11 * 0.85) = 10th smallest = 1.0
    monkeypatch.setattr(loso_ranges, "ALPHA", 0.15)
    lo, hi = loso_ranges.conformal_range([0.1 * k for k in range(1, 11)], 1.0)
    assert hi == pytest.approx(1.0)


def test_range_adds_the_unknown_inputs_in_quadrature():
    p = _row("r", "s", "x", 10.0, 10.0)
    p.unknown_lo, p.unknown_hi = 0.3, 0.4
    lo, hi = loso_ranges.widened_bounds(p, 100.0, -0.4, 0.3)
    assert lo == pytest.approx(100 * math.exp(-0.5)) and hi == pytest.approx(100 * math.exp(0.5))


def test_summary_counts_unpredicted_rows_in_the_share():
    a = Scored("a", "s", "x", "d", 100.0, pred_loso=110.0, lo_loso=90.0, hi_loso=120.0)
    b = Scored("b", "s", "x", "d", 100.0, pred_loso=70.0, lo_loso=60.0, hi_loso=80.0)
    c = Scored("c", "s", "x", "d", 100.0, reason="unknown model")
    s = summarise([a, b, c])
    assert s.rows == 3 and s.predicted == 2
    assert s.predicted_share == pytest.approx(2 / 3)
    assert s.mape == pytest.approx(20.0) and s.max_ape == pytest.approx(30.0)
    assert s.coverage == pytest.approx(0.5)


def test_unknown_system_uses_the_pooled_factors_with_a_wider_range():
    table = {
        POOLED: SystemParams(POOLED, 0.9, 1.1, -0.2, 0.2),
        "verl-fsdp": SystemParams("verl-fsdp", 0.8, 1.0, -0.5, 0.5),
    }
    assert system_params("VERL_FSDP", table).gen_eff == 0.8
    p = system_params("my-framework", table)
    assert (p.gen_eff, p.train_eff) == (0.9, 1.1)
    assert p.resid_hi == pytest.approx(0.3) and p.resid_lo == pytest.approx(-0.3)
    assert normalise(" NeMo RL_megatron ") == "nemo-rl-megatron"


def test_shipped_data_sets_share_one_schema_and_name_known_systems():
    paths = loso.default_datasets()
    headers = []
    for p in paths.values():
        with open(p, newline="") as fh:
            r = csv.DictReader(fh)
            rows = list(r)
            headers.append(r.fieldnames)
        assert all(row["system"] in SYSTEMS for row in rows), p
        assert all(row["source_locator"].strip() for row in rows), p
    assert headers[0] == headers[1]
    assert {"system", "model_kind", "gpu_memory_utilization"} <= set(headers[0])


def test_shipped_system_table_lists_the_pooled_prior():
    from rpeg.perf.systems import shipped

    table = shipped()
    assert POOLED in table and table[POOLED].rows > 50
    for name, p in table.items():
        assert name == POOLED or name in SYSTEMS
        assert 0.25 <= p.gen_eff <= 4 and 0.25 <= p.train_eff <= 4
        assert p.resid_lo <= 0 <= p.resid_hi


def test_a_shared_schema_row_is_calibrated_on_shared_schema_residuals():
    from dataclasses import replace

    explicit = [_row(f"e{i}", f"s{i % 3}", "", 10.0, 10.0) for i in range(9)]
    shadow = [
        replace(p, case_id=p.case_id + "#shared", shadow=True, regime="shared") for p in explicit
    ]
    resid = {p.case_id: 0.05 for p in explicit} | {p.case_id: 0.9 for p in shadow}
    shared_row = replace(_row("new", "s-new", "", 10.0, 10.0), regime="shared")
    pool, _ = loso_ranges.comparable_residuals(resid, explicit + shadow, shared_row, "s-new")
    assert pool == [0.9] * 9
    pool, _ = loso_ranges.comparable_residuals(resid, explicit + shadow, explicit[0], "s0")
    assert pool == [0.05] * 6  # the explicit rows of the other two sources


def test_shadow_copies_blank_the_explicit_columns_and_are_not_reported():
    from rpeg.perf.validation.published import read_rows

    rows = [r for r in read_rows() if r["case_id"].startswith("nemo-v0.5-h100bf16-llama")]
    sh = loso.shadows(rows, "d")
    assert len(sh) == len(rows) and all(p.shadow and p.regime == "shared" for p in sh)
    assert all("gpu_memory_utilization" in p.unknown for p in sh)
    priced = loso.price_rows(rows, "d")[0]
    scored = loso.score(priced + sh)
    assert {s.case_id for s in scored} == {r["case_id"] for r in rows}


def test_the_pooled_factors_weigh_systems_not_rows(monkeypatch):
    # a system published by 4 sources x 10 rows at factor 1 and one by a single source of 2
    # rows at 0.5: the unknown-system prior lies between them, not at the big system's 1.0
    monkeypatch.setattr(loso_fit, "SHRINK", 1e-6)
    rows = _set("big", g=1.0, t=1.0, sources=4, per=10)
    rows += [
        _row(f"small-{i}", "src-small", "small", 10.0 + 7 * i, 50.0 - 5 * i, 0.5, 0.5, True)
        for i in range(2)
    ]
    g, t = (math.exp(v) for v in loso.fit(rows)[POOLED])
    # between the two systems (0.5 .. 1) and well away from the big one: weighting sources
    # instead (the big system 9x the small one's weight) gave (1.0, 0.79)
    assert 0.5 <= g < 0.85 and 0.5 <= t < 0.7


def _length_row(case, source, kind, gen_s, true_m):
    """A row of unpublished length whose generation takes ``gen_s x m`` at length multiplier
    m (training 10 s), measured at the true multiplier ``true_m``."""
    steps = [[[gen_s * m / g + 10.0 / t for t in GRID] for g in GRID] for m in LEN_GRID]
    p = _row(case, source, "sys-a", gen_s * true_m, 10.0)
    return replace(
        p,
        step=np.array(steps),
        kind=kind,
        tokens_per_step=np.array([1e6 * m for m in LEN_GRID]),
        stage_pred={k: np.array([v[0]] * len(LEN_GRID)) for k, v in p.stage_pred.items()},
    )


def test_length_interpolation_is_exact_at_grid_points_and_log_linear_between():
    v = np.array([1.0, 2.0, 4.0, 8.0, 16.0])  # = 4 * m**2 on LEN_GRID (0.5 .. 2)
    assert at(v, 0.0) == pytest.approx(4.0)
    assert at(v, math.log(2.0)) == pytest.approx(16.0)
    # half-way (in log) between m = 1 and sqrt(2): sqrt(4 * 8)
    assert at(v, math.log(2.0) / 4) == pytest.approx(math.sqrt(32.0))
    assert at(np.array([7.0]), 0.5) == 7.0  # a row of published length ignores the multiplier


def test_the_length_prior_is_fitted_without_the_scored_source(monkeypatch):
    # three sources whose unpublished lengths are 1.41x the documented median: the fit finds
    # it (weak shrinkage), and a fourth source's rows are scored with the others' multiplier
    # even when its own rows say 0.5x
    monkeypatch.setattr(loso_fit, "LEN_SHRINK", 1e-6)
    monkeypatch.setattr(loso_fit, "SHRINK", 1e6)  # factors pinned at 1: only the length moves
    rows = [
        _length_row(f"r{s}-{i}", f"src{s}", "reasoning", 50.0 + 10 * i, math.sqrt(2.0))
        for s in range(3)
        for i in range(4)
    ]
    lm, _ = loso.fit_lengths(rows)
    assert math.exp(lm["reasoning"]) == pytest.approx(math.sqrt(2.0), rel=0.02)
    assert lm["instruct"] == 0.0  # no row takes it
    odd = [_length_row(f"odd-{i}", "src-odd", "reasoning", 60.0, 0.5) for i in range(3)]
    scored = {s.case_id: s for s in loso.score(rows + odd)}
    # LOSO: predicted with m = 1.41 (60 x 1.41 + 10), not its own 0.5
    assert scored["odd-0"].pred_loso == pytest.approx(60.0 * math.sqrt(2.0) + 10.0, rel=0.02)
    # src0's fold sees src1/src2 (1.41x) and the odd source (0.5x): a compromise between them
    assert 50.0 * 0.5 + 10.0 < scored["r0-0"].pred_loso < scored["r0-0"].measured_s


def test_a_published_system_prediction_takes_the_fitted_length_medians():
    from rpeg.perf.calibration import SHIPPED, Calibration
    from rpeg.perf.systems import _table

    med = _table()["fitted_length_medians"]
    cal = system_params("verl-fsdp").calibration(SHIPPED)
    assert cal.response_median_reasoning == med["reasoning"]
    assert cal.response_median_instruct == med["instruct"]
    # the documented priors stay the shipped calibration's (what LOSO shrinks towards)
    assert SHIPPED.response_median_reasoning == Calibration().response_median_reasoning
    assert SHIPPED.response_median_instruct == Calibration().response_median_instruct


def test_run_share_parses_a_runs_total_time_and_flags_hours_derived_steps():
    from rpeg.perf.validation.run_share import fitted_share, from_hours, outside_share

    r = {"measured_other": "old_log_prob_s=107.71; total_400_steps=3d17h05m"}
    # 3 d 17 h 05 min = 320,700 s over 400 steps of 790.1 s: 1.474% outside the steps
    assert outside_share(r, 790.1) == pytest.approx(320700 / (400 * 790.1) - 1)
    assert outside_share({"measured_other": "total_50_steps=7h9m"}, 484.623) == pytest.approx(
        25740 / (50 * 484.623) - 1
    )
    assert outside_share(r, None) is None and outside_share({}, 10.0) is None
    assert from_hours({"measured_other": "training_hours=41.0; ppo_steps=250"})
    assert not from_hours(r)
    assert fitted_share([0.01, 0.05, 0.03]) == pytest.approx(0.03)
    assert fitted_share([]) == 0.0 and fitted_share([-0.2]) == 0.0


def test_an_hours_derived_step_is_compared_with_the_step_plus_the_runs_share(monkeypatch):
    # one source publishes mean steps and run totals (5% outside the steps); another gives
    # only hours / steps: its LOSO prediction is the modelled step x 1.05
    monkeypatch.setattr(loso_fit, "SHRINK", 1e6)  # factors pinned at 1
    per_step = [replace(_row(f"a{i}", "src-a", "s", 10.0, 10.0), run_share=0.05) for i in range(3)]
    hours = [replace(_row(f"h{i}", "src-h", "s", 30.0, 10.0), from_hours=True) for i in range(2)]
    scored = {s.case_id: s for s in loso.score(per_step + hours)}
    assert scored["h0"].pred_loso == pytest.approx(40.0 * 1.05, rel=1e-3)
    assert scored["a0"].pred_loso == pytest.approx(20.0, rel=1e-3)  # a per-step row: as is


def test_the_fit_loss_is_squared_to_a_factor_two_and_linear_beyond():
    c = math.log(2.0)
    assert float(loso_fit.huber_loss(0.5)) == pytest.approx(0.25)
    assert float(loso_fit.huber_loss(-0.5)) == pytest.approx(0.25)
    # |r| = 1 > ln 2: 2 c |r| - c^2
    assert float(loso_fit.huber_loss(1.0)) == pytest.approx(2 * c - c * c)
    # a row missed 10x pulls like one missed ~3.3x in squared loss, not 10x
    assert float(loso_fit.huber_loss(math.log(10.0))) < math.log(10.0) ** 2 / 1.5
