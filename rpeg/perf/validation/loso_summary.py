"""Scored rows and their error figures (pure): MAPE, max, coverage of the printed range, share
predicted and median range width, over any group (data set, source, system) and per
published stage. The rows come from :func:`rpeg.perf.validation.loso.score`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Scored:
    """A row's in-sample and LOSO predictions and ranges."""

    case_id: str
    source: str
    system: str
    dataset: str
    measured_s: float | None
    reason: str = ""
    pred_in: float | None = None
    lo_in: float | None = None
    hi_in: float | None = None
    pred_loso: float | None = None
    lo_loso: float | None = None
    hi_loso: float | None = None
    system_fitted: bool = True  # False: the system had no rows outside this source
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)  # LOSO pred, meas
    tput: tuple[float, float] | None = None  # LOSO predicted, measured tokens/s
    unknown: tuple[str, ...] = ()
    solved: dict[str, Any] = field(default_factory=dict)
    assumed: tuple[str, ...] = ()  # "column=value" of the priors taken
    # one-shot: (prediction, low, high) per calibrating row of its source
    # (rpeg.perf.validation.loso_oneshot); empty when its source has no other step-time row
    one_shot: list[tuple[float, float, float]] = field(default_factory=list)
    # what the model reads of the row (its cells, free text read as columns), as one string:
    # rows with equal inputs get equal predictions (rpeg.perf.validation.loso_oneshot.floor)
    inputs: str = ""
    # mechanisms its prediction uses that no row of another source checks: each widened its
    # LOSO range (rpeg.perf.validation.mechanisms)
    unchecked: tuple[str, ...] = ()


@dataclass(frozen=True)
class Summary:
    """Error figures of a set of rows (percent; coverage and share as fractions)."""

    rows: int  # rows with a measured step time
    predicted: int
    mape: float
    max_ape: float
    coverage: float
    median_width: float

    @property
    def predicted_share(self) -> float:
        return self.predicted / self.rows if self.rows else float("nan")

    def as_dict(self) -> dict[str, float]:
        return {
            "mape": round(self.mape, 2),
            "max_ape": round(self.max_ape, 2),
            "coverage": round(self.coverage, 4),
            "predicted_share": round(self.predicted_share, 4),
            "rows": self.rows,
            "predicted": self.predicted,
            "median_width": round(self.median_width, 4),
        }


def summarise(scored: list[Scored], loso: bool = True) -> Summary:
    rows = [s for s in scored if s.measured_s]
    done = [s for s in rows if (s.pred_loso if loso else s.pred_in)]
    errs, inside, widths = [], [], []
    for s in done:
        p = s.pred_loso if loso else s.pred_in
        lo, hi = (s.lo_loso, s.hi_loso) if loso else (s.lo_in, s.hi_in)
        errs.append(abs(p - s.measured_s) / s.measured_s)  # type: ignore[operator]
        inside.append(lo <= s.measured_s <= hi)  # type: ignore[operator]
        widths.append((hi - lo) / p)  # type: ignore[operator]
    nan = float("nan")
    return Summary(
        rows=len(rows),
        predicted=len(done),
        mape=100 * sum(errs) / len(errs) if errs else nan,
        max_ape=100 * max(errs) if errs else nan,
        coverage=sum(inside) / len(inside) if inside else nan,
        median_width=float(np.median(widths)) if widths else nan,
    )


def by(scored: list[Scored], key: str, loso: bool = True) -> dict[str, Summary]:
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        groups.setdefault(getattr(s, key) or "?", []).append(s)
    return {k: summarise(v, loso) for k, v in sorted(groups.items())}


def stage_errors(scored: list[Scored]) -> dict[str, tuple[float, float, int]]:
    """stage -> (LOSO MAPE %, max %, rows) over the rows publishing that stage."""
    out: dict[str, list[float]] = {}
    for s in scored:
        for st, (p, m) in s.stages.items():
            out.setdefault(st, []).append(abs(p - m) / m)
    return {k: (100 * sum(v) / len(v), 100 * max(v), len(v)) for k, v in sorted(out.items())}
