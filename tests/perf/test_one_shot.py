"""One-shot accuracy (rpeg.perf.validation.loso_oneshot): a source's rows predicted after one of its
rows calibrated the model, on hand-built rows whose step is a known function of the factors."""

import math
from dataclasses import replace

import numpy as np
import pytest

from rpeg.perf.validation import loso
from rpeg.perf.validation.loso import GRID, Priced
from rpeg.perf.validation.loso_oneshot import summary
from rpeg.perf.validation.loso_report import lines, to_json
from rpeg.perf.validation.loso_summary import summarise


def _row(
    case, source, factor, gen_s=20.0, train_s=40.0, traits=("m", "g", "colocated/on"), fixed_s=0.0
):
    """Modelled step fixed + gen/g + train/t on the grid; measured at g = t = ``factor``."""
    grid = np.array([[[fixed_s + gen_s / g + train_s / t for t in GRID] for g in GRID]])
    return Priced(
        case_id=case,
        source=source,
        system="sys",
        dataset="synthetic",
        measured_s=fixed_s + (gen_s + train_s) / factor,
        measured_tput=None,
        step=grid,
        tokens_per_step=np.array([1e6]),
        stage_pred={"generate": np.array([gen_s]), "train_actor": np.array([train_s])},
        stage_meas={},
        unknown_lo=0.0,
        unknown_hi=0.0,
        traits=traits,
    )


def _sources(factors, per=4):
    """One source per factor: its rows share the factor (a source effect)."""
    return [
        _row(f"s{k}-{i}", f"src{k}", f, gen_s=10.0 + 5 * i, train_s=50.0 - 6 * i)
        for k, f in enumerate(factors)
        for i in range(per)
    ]


def _mape(scored):
    return summary(scored)["mape"]


def test_a_source_effect_seen_in_other_sources_is_learnt_from_one_row():
    scored = loso.score(_sources([0.6, 1.5, 0.8, 1.25, 0.7]))
    loso_mape = summarise(scored).mape
    assert loso_mape > 10.0  # each source is off by its own factor without its rows
    # one of its rows calibrates the others: the shared factor is exact for all of them
    assert _mape(scored) < 1.0
    assert all(len(s.one_shot) == 3 for s in scored)  # every other row of its source


def test_a_factor_shared_by_rows_with_fixed_costs_is_carried_as_a_factor():
    # a source's efficiencies are off by its factor; its rows spend 0-80% of the step in
    # costs the factors do not scale (weight sync, start-up), so the same factor error is
    # a different step error per row: the transfer is measured on factor shifts
    rows = [
        _row(f"s{k}-{i}", f"src{k}", f, gen_s=12.0, train_s=24.0, fixed_s=(0, 20, 60, 140)[i])
        for k, f in enumerate([0.6, 1.5, 0.7, 1.3, 0.8])
        for i in range(4)
    ]
    scored = loso.score(rows)
    assert summarise(scored).mape > 5.0
    assert _mape(scored) < 1.0


def test_the_calibrating_row_never_scores_itself():
    rows = _sources([0.6, 1.5, 0.8, 1.25])
    base = {s.case_id: s for s in loso.score(rows)}
    moved = [replace(p, measured_s=3 * p.measured_s) if p.case_id == "s0-0" else p for p in rows]
    after = {s.case_id: s for s in loso.score(moved)}
    own = [p for p, _, _ in after["s0-0"].one_shot]
    assert own == pytest.approx([p for p, _, _ in base["s0-0"].one_shot])
    other = [p for p, _, _ in after["s0-1"].one_shot]
    assert other != pytest.approx([p for p, _, _ in base["s0-1"].one_shot])


def test_errors_not_shared_within_sources_are_not_transferred():
    # each source's rows alternate fast/slow: one row's error says nothing of another's
    rows = [
        _row(f"s{k}-{i}", f"src{k}", (0.7, 1.4)[i % 2], gen_s=10.0 + 5 * i, train_s=40.0)
        for k in range(4)
        for i in range(4)
    ]
    scored = loso.score(rows)
    for s in scored:
        assert [p for p, _, _ in s.one_shot] == pytest.approx([s.pred_loso] * 3)


def test_a_source_with_one_row_has_no_one_shot_and_the_reports_carry_it():
    rows = _sources([0.6, 1.5, 0.8]) + [_row("alone", "src-alone", 0.5)]
    scored = loso.score(rows)
    (alone,) = [s for s in scored if s.case_id == "alone"]
    assert alone.one_shot == []
    doc = to_json(scored, [], ["synthetic"])
    assert doc["one_shot"]["rows"] == 12
    assert doc["one_shot"]["mape"] == pytest.approx(_mape(scored))
    assert doc["datasets"]["synthetic"]["one_shot"]["rows"] == 12
    assert doc["by_source"]["src-alone"]["one_shot"]["rows"] == 0
    assert math.isnan(doc["by_source"]["src-alone"]["one_shot"]["mape"])
    assert any(
        line.strip().startswith("one-shot   MAPE=") for line in lines(scored, [], ["synthetic"])
    )


def test_the_report_sets_the_calibration_beside_the_same_rows_uncalibrated():
    # sources whose rows share their factor: calibrating helps, and the report says by how
    # much against the same rows' leave-one-source-out error
    shared = loso.score(_sources([0.6, 1.5, 0.8, 1.25, 0.7]))
    o = summary(shared)
    assert o["uncalibrated"] == pytest.approx(summarise(shared).mape, abs=0.01)
    assert o["mape"] < o["uncalibrated"] - 10.0
    # one row without another of its source scores no one-shot and is not in either figure
    lonely = loso.score(_sources([0.6, 1.5, 0.8]) + [_row("alone", "src-alone", 0.3)])
    o = summary(lonely)
    kept = [s for s in lonely if s.one_shot]
    assert o["uncalibrated"] == pytest.approx(summarise(kept).mape, abs=0.01)
    assert o["uncalibrated"] < summarise(lonely).mape
    doc = to_json(lonely, [], ["synthetic"])
    assert doc["one_shot"]["uncalibrated"] == o["uncalibrated"]
    assert math.isnan(doc["by_source"]["src-alone"]["one_shot"]["uncalibrated"])
