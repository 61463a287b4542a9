"""Leave-one-source-out validation, system factors and conformal ranges (rpeg.perf.loso,
rpeg.perf.systems), on hand-built rows whose step time is a known function of the factors."""

import csv
import math

import numpy as np
import pytest

from rpeg.perf import loso
from rpeg.perf.loso import GRID, Priced
from rpeg.perf.loso_summary import Scored, summarise
from rpeg.perf.systems import POOLED, SYSTEMS, SystemParams, normalise, system_params


def _row(case, source, system, gen_s, train_s, true_g=1.0, true_t=1.0, stages=False):
    """A row whose modelled step is gen/g + train/t (a synchronous step), measured at the
    true factors."""
    grid = np.array([[gen_s / g + train_s / t for t in GRID] for g in GRID])
    meas = gen_s / true_g + train_s / true_t
    return Priced(
        case_id=case,
        source=source,
        system=system,
        dataset="synthetic",
        measured_s=meas,
        measured_tput=None,
        step=grid,
        tokens_per_step=1e6,
        stage_pred={"generate": gen_s, "train_actor": train_s},
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
    monkeypatch.setattr(loso, "SHRINK", 1e-6)
    fitted = loso.fit(_set(g=0.5, t=2.0))
    g, t = (math.exp(v) for v in fitted["sys-a"])
    assert g == pytest.approx(0.5, rel=0.04) and t == pytest.approx(2.0, rel=0.04)


def test_shrinkage_pulls_a_thin_system_towards_the_pooled_factors(monkeypatch):
    monkeypatch.setattr(loso, "SHRINK", 2.0)
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


def test_conformal_half_width_is_the_ceil_n_plus_1_quantile_of_abs_residuals():
    # n = 5, alpha = 0.2: the ceil(6 * 0.8) = 5th smallest |r| = 0.4
    lo, hi = loso._range([0.1, -0.2, 0.3, 0.05, -0.4], 1.0)
    assert (lo, hi) == pytest.approx((-0.4, 0.4))
    # n = 10: the ceil(11 * 0.8) = 9th smallest of 0.1 .. 1.0 = 0.9; widened 1.5x
    lo, hi = loso._range([0.1 * k for k in range(1, 11)], 1.5)
    assert hi == pytest.approx(0.9 * 1.5)


def test_range_adds_the_unknown_inputs_in_quadrature():
    p = _row("r", "s", "x", 10.0, 10.0)
    p.unknown_lo, p.unknown_hi = 0.3, 0.4
    lo, hi = loso._bounds(p, 100.0, -0.4, 0.3)
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
    pool, _ = loso._comparable(resid, explicit + shadow, shared_row, "s-new")
    assert pool == [0.9] * 9
    pool, _ = loso._comparable(resid, explicit + shadow, explicit[0], "s0")
    assert pool == [0.05] * 6  # the explicit rows of the other two sources


def test_shadow_copies_blank_the_explicit_columns_and_are_not_reported():
    from rpeg.perf.published import read_rows

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
    monkeypatch.setattr(loso, "SHRINK", 1e-6)
    rows = _set("big", g=1.0, t=1.0, sources=4, per=10)
    rows += [
        _row(f"small-{i}", "src-small", "small", 10.0 + 7 * i, 50.0 - 5 * i, 0.5, 0.5, True)
        for i in range(2)
    ]
    g, t = (math.exp(v) for v in loso.fit(rows)[POOLED])
    # between the two systems (0.5 .. 1) and well away from the big one: weighting sources
    # instead (the big system 9x the small one's weight) gave (1.0, 0.79)
    assert 0.5 <= g < 0.85 and 0.5 <= t < 0.7
