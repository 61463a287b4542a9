"""The response-length prior as a fitted quantity of the leave-one-source-out check (pure).

A row that does not publish its mean response length is priced with the prior of its model's
kind (rpeg.perf.lengths.prior_mean: a lognormal whose median is ``Calibration.
response_median_reasoning`` / ``response_median_instruct``). Those medians are priors like
the system factors: :mod:`rpeg.perf.validation.loso` fits one multiplier per kind (``reasoning``;
``instruct`` for base and instruct models, which share a median) on the rows of *other*
sources whose lengths are unpublished, shrunk towards the documented medians, and scores
each source with the multipliers fitted without it. Here: the grid each such row is priced
on and the interpolation between its points; the fit itself is ``loso.fit_lengths``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from rpeg.perf.calibration import Calibration

#: multipliers of the documented medians each unpublished-length row is priced at
LEN_GRID = tuple(2 ** (k / 2) for k in range(-2, 3))  # 0.5 .. 2
LOG_LEN = np.log(np.array(LEN_GRID))
#: candidate log multipliers the fit chooses among (interpolated between grid points)
LEN_FINE = np.linspace(LOG_LEN[0], LOG_LEN[-1], 17)
#: pseudo-weight pulling a kind's log multiplier towards 0 (the documented median)
LEN_SHRINK = 5.0
#: fewest sources whose rows of a kind may move its median (one source would be its own fit)
MIN_LENGTH_SOURCES = 1
#: the kinds with a median of their own (base models share the instruct median)
KINDS = ("instruct", "reasoning")


def prior_kind(kind: str | None) -> str:
    """The median a model of ``kind`` takes: ``reasoning`` or ``instruct``."""
    return "reasoning" if kind == "reasoning" else "instruct"


def scaled(calib: Calibration, m: float) -> Calibration:
    """``calib`` with both kinds' medians multiplied by ``m``."""
    return replace(
        calib,
        response_median_reasoning=calib.response_median_reasoning * m,
        response_median_instruct=calib.response_median_instruct * m,
    )


def at(values: np.ndarray, lm: float) -> Any:
    """``values`` (first axis over :data:`LEN_GRID`, or of length 1 when the row's length is
    published) at log multiplier ``lm``: interpolated linearly in log between grid points."""
    if values.shape[0] == 1:
        return values[0]
    lm = min(max(lm, LOG_LEN[0]), LOG_LEN[-1])
    i = min(int(np.searchsorted(LOG_LEN, lm)) - 1, len(LOG_LEN) - 2)
    i = max(i, 0)
    f = (lm - LOG_LEN[i]) / (LOG_LEN[i + 1] - LOG_LEN[i])
    return np.exp((1 - f) * np.log(values[i]) + f * np.log(values[i + 1]))


def multiplier(fitted: dict[str, float], kind: str) -> float:
    """The log multiplier of ``kind`` in a fit ('' = the row's length is published: 0)."""
    return fitted.get(kind, 0.0) if kind else 0.0


def describe(fitted: dict[str, float], calib: Calibration) -> dict[str, float]:
    """The fitted medians in tokens, by kind."""
    base = {
        "reasoning": calib.response_median_reasoning,
        "instruct": calib.response_median_instruct,
    }
    return {k: round(base[k] * math.exp(fitted.get(k, 0.0))) for k in KINDS}
