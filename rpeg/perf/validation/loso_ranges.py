"""Ranges of the leave-one-source-out check (pure): a row's range is its point x exp(-/+h),
h the split-conformal half-width of the LOSO residuals of comparable rows of other sources,
added in quadrature to the width of the inputs the row leaves unknown
(docs/validation.md, "Ranges")."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: target miscoverage of a range (split conformal over comparable LOSO residuals). 0.12,
#: not the 0.2 of an "80% range": residuals of other sources are not exchangeable with a new
#: source's (each source carries its own shift), so a nominal 80% range under-covers unseen
#: sources (the hidden set of issue 30: 53% inside). The rule: the largest of 0.15, 0.14,
#: ... at which every set held here -- both shipped files and their shared-schema copies --
#: covers >= 85% under LOSO (80% + 5 points for sources unlike them): 0.15 covered the
#: steps_dev2 copy 79.4%, 0.13 85.3%, 0.12 88.2% (docs/validation.md "Ranges")
ALPHA = 0.12
#: log half-width when no residual is available (a factor of e^0.5 = 1.65 either way)
NO_RESIDUALS = 0.5
#: fewest other-source residuals of a system before its own spread is used
MIN_COMPARABLE = 6


def conformal_range(resid: list[float], widen: float) -> tuple[float, float]:
    """Split-conformal half-width (log) at miscoverage ``ALPHA``: the
    ``ceil((n+1)(1-ALPHA))``-th smallest absolute residual of the comparable rows."""
    if not resid:
        return -NO_RESIDUALS * widen, NO_RESIDUALS * widen
    a = np.sort(np.abs(np.array(resid)))
    k = min(len(a), math.ceil((len(a) + 1) * (1 - ALPHA))) - 1
    return -float(a[k]) * widen, float(a[k]) * widen


def widened_bounds(
    p: Any, pred: float, lo_q: float, hi_q: float, extra: float = 0.0
) -> tuple[float, float]:
    """Range: residual quantiles, the unknown inputs' widths and ``extra`` (log, either way:
    mechanisms no other source checks, rpeg.perf.validation.mechanisms), in quadrature."""
    down = math.sqrt(lo_q * lo_q + p.unknown_lo**2 + extra * extra)
    up = math.sqrt(hi_q * hi_q + p.unknown_hi**2 + extra * extra)
    return pred * math.exp(-down), pred * math.exp(up)


def comparable_residuals(
    resid: dict[str, float], rows: list[Any], p: Any, exclude: str | None
) -> tuple[list[float], bool]:
    """Residuals of rows comparable to ``p`` outside source ``exclude``: the same regime
    (what the rows state), and the same system when it has >= MIN_COMPARABLE of them."""
    pool = [q for q in rows if q.source != exclude and q.regime == p.regime]
    if len(pool) < MIN_COMPARABLE:
        pool = [q for q in rows if q.source != exclude and not q.shadow]
    same = [resid[q.case_id] for q in pool if q.system == p.system]
    if p.system and len(same) >= MIN_COMPARABLE:
        return same, True
    return [resid[q.case_id] for q in pool], False
