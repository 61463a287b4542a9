"""The one-shot floor (rpeg.perf.validation.loso_oneshot.floor): rows whose inputs are the same get
the same prediction whatever calibrates the model, so their spread bounds the one-shot error
from below. Hand-worked on four rows."""

import pytest

from rpeg.perf.validation.loso_oneshot import floor, summary
from rpeg.perf.validation.loso_summary import Scored


def _scored(case, measured, inputs, preds, source="src"):
    s = Scored(case, source, "sys", "synthetic", measured)
    s.pred_loso = measured
    s.inputs = inputs
    s.one_shot = [(p, 0.5 * p, 2 * p) for p in preds]
    return s


def test_rows_with_the_same_inputs_bound_the_error_from_below():
    # a1, a2, a3 read the same; a4 differs. Calibrating on a1 leaves {a2, a3} to one value:
    # at best |125/200 - 1| = 0.375; on a2: {a1, a3}, 0.5; on a3: {a1, a2}, 0.2; on a4:
    # {a1, a2, a3}, 0.625 (p = 125). Each row's error is a mean over its 3 calibrating rows:
    # (0.375 + 0.5 + 0.2 + 0.625) / 3 / 4 rows = 0.1417
    same = "same inputs"
    rows = [
        _scored("a1", 100.0, same, [100, 100, 100]),
        _scored("a2", 125.0, same, [125, 125, 125]),
        _scored("a3", 200.0, same, [200, 200, 200]),
        _scored("a4", 50.0, "other inputs", [50, 50, 50]),
    ]
    assert floor(rows) == pytest.approx(1.7 / 12, rel=1e-9)
    # predictions that are exact for every row (possible only for a model that reads more
    # than the inputs) score below the floor: the floor is not the error, a bound of it
    assert summary(rows)["mape"] == 0.0
    assert summary(rows)["floor"] == pytest.approx(100 * 1.7 / 12, abs=0.01)


def test_no_floor_when_every_row_reads_differently_or_stands_alone():
    rows = [_scored(f"r{i}", 100.0 + i, f"inputs {i}", [100, 100]) for i in range(3)]
    assert floor(rows) == 0.0
    assert floor([_scored("x", 100.0, "x", [])]) == 0.0  # a source of one row: not scored


def test_the_hindsight_optimum_finds_a_shared_factor_and_leaves_what_is_not_shared():
    import numpy as np

    from rpeg.perf.validation.loso import GRID, Priced
    from rpeg.perf.validation.loso_oracle import source_optimum

    def row(case, factor, gen_s, train_s):
        grid = np.array([[[gen_s / g + train_s / t for t in GRID] for g in GRID]])
        return Priced(
            case_id=case, source="s", system="sys", dataset="syn",
            measured_s=(gen_s + train_s) / factor, measured_tput=None, step=grid,
            tokens_per_step=np.array([1e6]), stage_pred={}, stage_meas={},
            unknown_lo=0.0, unknown_hi=0.0,
        )  # fmt: skip

    fold = lambda p: (0.0, 0.0, 0.0, 0.0)  # noqa: E731
    # every row 1.5x slower than modelled: one shift of both efficiencies makes all exact
    shared = [row(f"r{i}", 1 / 1.5, 10.0 + 5 * i, 40.0 - 5 * i) for i in range(4)]
    mape, (dg, dt, _) = source_optimum(shared, fold)
    assert mape < 0.01 and dg == dt == pytest.approx(-np.log(1.5), abs=0.06)
    # two rows modelled alike at 40 s, measured 32 s and 50 s: one prediction x for both
    # errs |x/32 - 1| + |x/50 - 1|, least at x = 32 (0 + 0.36): a mean of 0.18 is left
    split = [row("a", 1.25, 20.0, 20.0), row("b", 0.8, 20.0, 20.0)]
    mape, _ = source_optimum(split, fold)
    assert mape == pytest.approx(0.18, abs=0.01)
