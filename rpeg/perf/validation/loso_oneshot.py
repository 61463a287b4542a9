"""One-shot accuracy (pure): a source's other rows predicted after one of its rows calibrated
the model, the way ``rpeg calibrate`` fits a user's own run (rpeg.perf.calibration.fit).

The starting point of each source is its leave-one-source-out fit (rpeg.perf.validation.loso: system
factors and length-prior multipliers fitted without it: what a user of a system the model
never saw starts from). One row of the source -- the calibrating row -- then sets the
machine's efficiencies as ``rpeg calibrate`` does from a run's units:

one common shift of both log factors (``gen_eff_scale`` and ``train_eff_scale`` together)
makes the row's step exact, and a step beyond the factor grid keeps the remaining ratio. (A
published step time alone cannot separate generation from training; setting each factor
from published stage times instead was tried and scored worse: docs/validation.md.)

The shift reaches another row of the source in the share the two rows' errors are shared:
for their class of pair (same model, GPU, mode and system or not), the least-squares transfer
``sum d_c d_r / sum d_c^2`` over the *other* sources' pairs, where ``d`` is a row's own
calibration -- the log factor shift (plus the log of any remaining ratio) that makes it exact
from its leave-one-source-out fit. The transfer is measured in the quantity it moves: a step
error is not a factor error when fixed costs (weight sync, start-up, the optimizer) take part
of the step, and a row whose step barely answers the factors needs a large shift to be exact
(measured on step errors instead: one-shot 20.6 -> 23.0%, docs/validation.md). A user's one
run says little about a run of another model, and the data say how little. The calibrating
row never scores itself. Each row's one-shot error is its mean over
the choice of calibrating row; ranges are the row's LOSO range, moved with its prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpeg.perf.validation.loso_fit import LOG_GRID

#: log factor range the shifts are solved in (the priced grid; beyond it the ratio remains)
_LO, _HI = float(LOG_GRID[0]), float(LOG_GRID[-1])

Fold = tuple[float, float, float, float]  # log gen, log train, log length mult, run share


@dataclass(frozen=True)
class Calibrated:
    """What one calibrating row sets: log-factor shifts and the remaining ratio."""

    d_gen: float
    d_train: float
    ratio: float = 1.0


def _pred(p: Any, fold: Fold, cal: Calibrated) -> float:
    lg, lt, lk, sh = fold
    run = (1 + sh) if p.from_hours else 1.0
    return run * cal.ratio * math.exp(p.log_pred(lg + cal.d_gen, lt + cal.d_train, lk))


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] with f(x) = target for f decreasing in x (bisection; an end when
    the target lies beyond it)."""
    if f(lo) <= target:
        return lo
    if f(hi) >= target:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def calibrate(p: Any, fold: Fold) -> Calibrated:
    """The shifts that make the calibrating row ``p`` predicted at its measurement."""
    lg, lt, _, _ = fold
    lo, hi = _LO - max(lg, lt), _HI - min(lg, lt)
    d = _solve(lambda x: math.log(_pred(p, fold, Calibrated(x, x))), math.log(p.measured_s), lo, hi)
    cal = Calibrated(d, d)
    return Calibrated(d, d, p.measured_s / _pred(p, fold, cal))


#: a class of row pairs (which traits they share) sets its own transfer only with at least
#: this many pairs from at least two sources; else all pairs of the other sources set it
MIN_PAIRS = 6


def shift_of(cal: Calibrated) -> float:
    """A row's calibration as one log factor shift: the common shift of both factors plus the
    log of the ratio that remains beyond the factor grid."""
    return cal.d_gen + math.log(cal.ratio)


def _transfers(group: list[Any], resid: dict[str, float]) -> dict[tuple[bool, ...], float]:
    """Per class of pair (model, GPU, mode, system shared or not): the share of one row's
    calibration shift that another row of the same source repeats, ``sum d_c d_r / sum d_c^2``
    over the ordered pairs of ``group`` (rows of other sources; ``resid``: case id -> d);
    key ``()``: all pairs."""
    by_source: dict[str, list[Any]] = {}
    for p in group:
        by_source.setdefault(p.source, []).append(p)
    num: dict[tuple[bool, ...], float] = {}
    den: dict[tuple[bool, ...], float] = {}
    n: dict[tuple[bool, ...], int] = {}
    srcs: dict[tuple[bool, ...], set[str]] = {}
    for src, rows in by_source.items():
        for c in rows:
            for p in rows:
                if p is c:
                    continue
                ec, er = resid[c.case_id], resid[p.case_id]
                for key in (_shared(c, p), ()):
                    num[key] = num.get(key, 0.0) + ec * er
                    den[key] = den.get(key, 0.0) + ec * ec
                    n[key] = n.get(key, 0) + 1
                    srcs.setdefault(key, set()).add(src)
    return {
        k: min(1.0, max(0.0, num[k] / den[k]))
        for k in num
        if den[k] > 0 and (k == () or (n[k] >= MIN_PAIRS and len(srcs[k]) >= 2))
    }


def _shared(c: Any, p: Any) -> tuple[bool, ...]:
    return tuple(a == b for a, b in zip(c.traits, p.traits, strict=False))


def _scaled(cal: Calibrated, rho: float) -> Calibrated:
    return Calibrated(rho * cal.d_gen, rho * cal.d_train, cal.ratio**rho)


def one_shot(rows: list[Any], folds: dict[str, Fold], ranges: dict[str, tuple[float, float]]):
    """case id -> [(prediction, low, high) per calibrating row of its source] for every row
    of a source with two or more step-time ``rows``; ``folds`` holds each row's LOSO fit and
    ``ranges`` its LOSO range relative to its LOSO prediction (low/pred, high/pred).

    A calibrating row's shifts reach another row of its source in the share its error is
    shared: the transfer of their class of pair, measured on the other sources' rows."""
    rows = [p for p in rows if p.measured_s and not p.shadow]
    cals = {p.case_id: calibrate(p, folds[p.case_id]) for p in rows}
    resid = {k: shift_of(c) for k, c in cals.items()}
    by_source: dict[str, list[Any]] = {}
    for p in rows:
        by_source.setdefault(p.source, []).append(p)
    out: dict[str, list[tuple[float, float, float]]] = {}
    for source, group in by_source.items():
        if len(group) < 2:
            continue
        rho = _transfers([p for p in rows if p.source != source], resid)
        for c in group:
            cal = cals[c.case_id]
            for p in group:
                if p is c:
                    continue
                share = rho.get(_shared(c, p), rho.get((), 0.0))
                pred = _pred(p, folds[p.case_id], _scaled(cal, share))
                lo, hi = ranges[p.case_id]
                out.setdefault(p.case_id, []).append((pred, lo * pred, hi * pred))
    return out


def summary(scored: list[Any]) -> dict[str, float]:
    """One-shot figures of ``scored`` rows: MAPE of each row's mean error over its
    calibrating rows, the largest single error (any calibrating row), the share of
    (row, calibrating row) pairs inside the moved range; rows = rows scored;
    ``uncalibrated``: the leave-one-source-out MAPE of the same rows (no row of their
    source calibrating), so what the calibration changes reads as the difference."""
    errs, worst, inside, before = [], 0.0, [], []
    for s in scored:
        if not s.one_shot or not s.measured_s:
            continue
        e = [abs(p - s.measured_s) / s.measured_s for p, _, _ in s.one_shot]
        errs.append(float(np.mean(e)))
        before.append(abs((s.pred_loso or 0.0) - s.measured_s) / s.measured_s)
        worst = max(worst, max(e))
        inside += [lo <= s.measured_s <= hi for _, lo, hi in s.one_shot]
    nan = float("nan")
    return {
        "mape": round(100 * float(np.mean(errs)), 2) if errs else nan,
        "max_ape": round(100 * worst, 2) if errs else nan,
        "coverage": round(sum(inside) / len(inside), 4) if inside else nan,
        "rows": len(errs),
        "floor": round(100 * floor(scored), 2) if errs else nan,
        "uncalibrated": round(100 * float(np.mean(before)), 2) if errs else nan,
    }


def _least_ape_sum(measured: list[float]) -> float:
    """The least sum of absolute percentage errors one prediction can have over rows measured
    at ``measured``: sum |p/m - 1| is convex and piecewise linear in p, so its least value is
    at one of the measurements."""
    return min(sum(abs(p / m - 1) for m in measured) for p in measured)


def floor(scored: list[Any]) -> float:
    """A lower bound of the one-shot MAPE of ``scored`` that no model reaches below: rows whose
    inputs are the same (``Scored.inputs``: every cell the model reads) get the same
    prediction from any model and any calibrating row, so within each such group of a
    source's scored rows the errors sum to at least the least sum one value can have. Summed
    per calibrating row (each row's one-shot error is its mean over the other rows of its
    source) and averaged over the rows scored; 0 when no two scored rows of a source share
    their inputs."""
    rows = [s for s in scored if s.one_shot and s.measured_s]
    if not rows:
        return 0.0
    by_source: dict[str, list[Any]] = {}
    for s in rows:
        by_source.setdefault(s.source, []).append(s)
    total = 0.0
    for group in by_source.values():
        n = len(group[0].one_shot)  # calibrating rows per scored row: the others of its source
        for c in group:
            same: dict[str, list[float]] = {}
            for s in group:
                if s is not c:
                    same.setdefault(s.inputs, []).append(s.measured_s)
            total += sum(_least_ape_sum(m) for m in same.values() if len(m) > 1) / n
    return total / len(rows)
