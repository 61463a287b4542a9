"""The fit of the leave-one-source-out check (pure): per-system factors and the
response-length multipliers, from rows priced on a grid (rpeg.perf.validation.loso.price_rows).

Each row is priced once per point of a grid of (gen_eff, train_eff) factors; the fit
minimises a Huber loss of the log errors of the step times (and of the published
generation/training stage times, which separate the two factors) over that grid,
bilinearly interpolated in the inverse factors, with each source weighted ``1/sqrt(rows)``.
The pooled factors (what an unknown system takes) weigh every system equally and are shrunk
to 1; each system's are shrunk to the pooled ones (``SHRINK``). docs/perf-model.md,
"Systems".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rpeg.perf.systems import POOLED
from rpeg.perf.validation.loso_lengths import (
    KINDS,
    LEN_FINE,
    LEN_SHRINK,
    MIN_LENGTH_SOURCES,
    at,
    multiplier,
)

#: factor grid each row is priced on (time = modelled / factor)
GRID = tuple(2 ** (k * 2 / 3) for k in range(-3, 4))  # 0.25 .. 4
LOG_GRID = np.log(np.array(GRID))
#: fine grid the objective is minimised on (log space, interpolated)
_FINE = np.linspace(LOG_GRID[0], LOG_GRID[-1], 49)
_FG, _FT = np.meshgrid(_FINE, _FINE, indexing="ij")
#: pseudo-weight pulling a system's log factors to the pooled ones (pooled: to 0)
SHRINK = 20.0
#: log residual beyond which the fit's loss grows linearly (a factor of 2)
HUBER = math.log(2.0)
#: weight of a published stage time relative to a step time
STAGE_WEIGHT = 0.5
Params = tuple[float, float]  # log gen factor, log train factor


def interp_step(step: np.ndarray, lg: Any, lt: Any) -> Any:
    """Log of the step at (log gen, log train) factors: bilinear in the inverse factors
    (each unit's time is proportional to 1/factor, so a sum of units is exact and a max of
    pools piecewise exact) between the grid points."""
    lg, lt = np.clip(lg, LOG_GRID[0], LOG_GRID[-1]), np.clip(lt, LOG_GRID[0], LOG_GRID[-1])
    i = np.clip(np.searchsorted(LOG_GRID, lg) - 1, 0, len(LOG_GRID) - 2)
    j = np.clip(np.searchsorted(LOG_GRID, lt) - 1, 0, len(LOG_GRID) - 2)
    inv = np.exp(-LOG_GRID)
    fi = (np.exp(-lg) - inv[i]) / (inv[i + 1] - inv[i])
    fj = (np.exp(-lt) - inv[j]) / (inv[j + 1] - inv[j])
    v = (
        step[i, j] * (1 - fi) * (1 - fj)
        + step[i + 1, j] * fi * (1 - fj)
        + step[i, j + 1] * (1 - fi) * fj
        + step[i + 1, j + 1] * fi * fj
    )
    return np.log(v)


def huber_loss(r: Any) -> Any:
    """Huber loss of log residuals: squared up to ``HUBER``, linear beyond, so that a row
    the model misses by more than 2x (a mechanism it lacks, a row read wrongly) pulls the
    fitted quantities no harder than one it misses by 2x."""
    a = np.abs(r)
    return np.where(a <= HUBER, a * a, 2 * HUBER * a - HUBER * HUBER)


_FINE_CACHE: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {}


def _fine_step(p: Any, lk: float) -> np.ndarray:
    """The row's modelled step (seconds) over the fine (gen, train) grid at log length
    multiplier ``lk`` (memoised per priced grid)."""
    key = (id(p.step), round(lk, 9))
    hit = _FINE_CACHE.get(key)
    if hit is None or hit[0] is not p.step:  # the grid itself is kept: ids are reused
        if len(_FINE_CACHE) > 20000:
            _FINE_CACHE.clear()
        hit = _FINE_CACHE[key] = (p.step, np.exp(interp_step(at(p.step, lk), _FG, _FT)))
    return hit[1]


_LOSS_CACHE: dict[tuple[int, float, float], tuple[np.ndarray, np.ndarray]] = {}


def _row_loss(p: Any, lk: float) -> np.ndarray:
    """The row's unweighted loss over the fine (gen, train) grid at log length multiplier
    ``lk``: its step's, plus ``STAGE_WEIGHT`` x each published stage time's (memoised per
    priced grid, multiplier and measurement: the folds refit the same rows many times)."""
    key = (id(p.step), round(lk, 9), p.measured_s)
    hit = _LOSS_CACHE.get(key)
    if hit is not None and hit[0] is p.step:  # the grid itself is kept: ids are reused
        return hit[1]
    loss = huber_loss(math.log(p.measured_s) - np.log(_fine_step(p, lk)))
    for st, m in p.stage_meas.items():
        pr = float(at(p.stage_pred[st], lk)) if st in p.stage_pred else 0.0
        if pr:
            lf = _FG if st == "generate" else _FT
            loss = loss + STAGE_WEIGHT * huber_loss(math.log(m) - (math.log(pr) - lf))
    if len(_LOSS_CACHE) > 20000:
        _LOSS_CACHE.clear()
    _LOSS_CACHE[key] = (p.step, loss)
    return loss


def _objective(rows: list[Any], weights: dict[str, float], lm: dict[str, float]) -> np.ndarray:
    """Weighted loss of ``rows`` over the fine (gen, train) grid, each row at the length
    multiplier ``lm`` of its kind."""
    obj = np.zeros_like(_FG)
    for p in rows:
        obj += weights[p.source] * _row_loss(p, multiplier(lm, p.kind))
    return obj


def _prior(pg: float, pt: float) -> np.ndarray:
    """Shrinkage towards (pg, pt) over the fine grid."""
    return SHRINK * ((_FG - pg) ** 2 + (_FT - pt) ** 2)


def _argmin(obj: np.ndarray) -> Params:
    i, j = np.unravel_index(int(np.argmin(obj)), obj.shape)
    return float(_FINE[i]), float(_FINE[j])


def fit(rows: list[Any], lm: dict[str, float] | None = None) -> dict[str, Params]:
    """Log (gen, train) factors per system and ``pooled`` from step-time ``rows``, each row
    at the length multiplier ``lm`` of its kind (default: the documented medians)."""
    return _fit(rows, lm or {})[0]


def fit_lengths(rows: list[Any]) -> tuple[dict[str, float], dict[str, Params]]:
    """The log length multiplier of each kind and the factors fitted with them:
    coordinate descent over :data:`LEN_FINE` per kind (two rounds), minimising the fit's
    objective plus ``LEN_SHRINK`` x multiplier^2; a kind whose rows come from fewer than
    ``MIN_LENGTH_SOURCES`` sources stays at 0 (the documented median)."""
    rows = [p for p in rows if p.measured_s]
    lm = {k: 0.0 for k in KINDS}
    best = _fit(rows, lm)
    for _ in range(2):
        for k in KINDS:
            if len({p.source for p in rows if p.kind == k}) < MIN_LENGTH_SOURCES:
                continue  # one source's rows moving a prior would be that source's fit
            for v in LEN_FINE:
                trial = {**lm, k: float(v)}
                f = _fit(rows, trial)
                if f[1] < best[1]:
                    lm, best = trial, f
    return lm, best[0]


def _fit(rows: list[Any], lm: dict[str, float]) -> tuple[dict[str, Params], float]:
    """(factors, objective at them incl. the length penalty); see :func:`fit`."""
    rows = [p for p in rows if p.measured_s]
    counts: dict[str, int] = {}
    for p in rows:
        counts[p.source] = counts.get(p.source, 0) + 1
    weights = {s: 1.0 / math.sqrt(n) for s, n in counts.items()}
    # the pooled factors stand for a system nobody fitted: each system's rows carry the
    # same total weight (a system with many published runs is still one system)
    groups: dict[str, list[Any]] = {}
    for p in rows:
        groups.setdefault(p.system, []).append(p)
    totals = {s: sum(weights[p.source] for p in g) for s, g in groups.items()}
    mean = sum(totals.values()) / max(1, len(totals))
    pooled_obj = _prior(0.0, 0.0)
    objs = {s: _objective(g, weights, lm) for s, g in groups.items()}
    for s in groups:
        pooled_obj = pooled_obj + mean / totals[s] * objs[s]
    pooled = _argmin(pooled_obj)
    out = {POOLED: pooled}
    total = LEN_SHRINK * sum(v * v for v in lm.values())
    prior = _prior(*pooled)
    for system in sorted(groups):
        if system:
            obj = objs[system] + prior
            out[system] = _argmin(obj)
            total += float(obj.min())
        else:  # rows that name no system take the pooled factors
            total += float(
                objs[system][_FINE.searchsorted(pooled[0]), _FINE.searchsorted(pooled[1])]
            )
    return out, total


def params(fitted: dict[str, Params], system: str) -> tuple[Params, bool]:
    """The factors a row of ``system`` takes, and whether they were fitted for it."""
    if system in fitted:
        return fitted[system], True
    return fitted[POOLED], False
