"""The hindsight optimum of a one-shot calibration (pure; docs/validation.md "Why one-shot <=
10% is out of reach here"): per source, the shifts of the quantities a calibration sets -- the
generation and training efficiencies and the length-prior multiplier -- chosen on the scored
rows themselves to minimise the source's MAPE from its leave-one-source-out fit. No calibration
from one of its rows sets those quantities better for the others (up to that row being left
out of the scored set), so this bounds what calibrating on a published run can reach.

``python -m rpeg.perf.validation.loso_oracle`` prints it for the shipped sets (~15 s).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rpeg.perf.validation.loso_lengths import LOG_LEN

#: log shifts searched for each efficiency (0.1 apart) and for the length multiplier
SHIFTS = np.linspace(-1.5, 1.5, 31)
LEN_SHIFTS = np.linspace(LOG_LEN[0], LOG_LEN[-1], 9)


def source_optimum(group: list[Any], fold: Any) -> tuple[float, tuple[float, float, float]]:
    """(least MAPE, (d_gen, d_train, log length multiplier)) of one source's priced step rows
    ``group``; ``fold(p)`` gives a row's (log gen, log train, log length, run share) fit
    without the source."""
    best = (math.inf, (0.0, 0.0, 0.0))
    lens = LEN_SHIFTS if any(p.kind for p in group) else (None,)
    for dg in SHIFTS:
        for dt in SHIFTS:
            for dl in lens:
                err = 0.0
                for p in group:
                    lg, lt, lk, sh = fold(p)
                    if dl is not None and p.kind:
                        lk = dl
                    run = (1 + sh) if p.from_hours else 1.0
                    pred = run * math.exp(p.log_pred(lg + dg, lt + dt, lk))
                    err += abs(pred / p.measured_s - 1)
                if err / len(group) < best[0]:
                    best = (err / len(group), (float(dg), float(dt), float(dl or 0.0)))
    return best


def optimum(priced: list[Any]) -> dict[str, tuple[float, int]]:
    """source -> (hindsight MAPE, rows) for every source with two or more step rows, and
    ``"pooled"`` over them (rows-weighted)."""
    from rpeg.perf.validation.loso import per_step, share_of
    from rpeg.perf.validation.loso_fit import fit_lengths, params
    from rpeg.perf.validation.loso_lengths import multiplier

    steps = [p for p in priced if p.measured_s and not p.shadow]
    by: dict[str, list[Any]] = {}
    for p in steps:
        by.setdefault(p.source, []).append(p)
    out: dict[str, tuple[float, int]] = {}
    for source, group in by.items():
        if len(group) < 2:
            continue
        others = [p for p in steps if p.source != source]
        sh = share_of(others)
        lm, fitted = fit_lengths(per_step(others, sh))

        def fold(p: Any, lm: Any = lm, fitted: Any = fitted, sh: float = sh) -> tuple:
            (lg, lt), _ = params(fitted, p.system)
            return lg, lt, multiplier(lm, p.kind), sh

        out[source] = (source_optimum(group, fold)[0], len(group))
    n = sum(r for _, r in out.values())
    if n:
        out["pooled"] = (sum(m * r for m, r in out.values()) / n, n)
    return out


def main() -> None:
    from rpeg.perf.validation.loso import default_datasets, price_rows
    from rpeg.perf.validation.published import read_rows

    priced = []
    for label, path in default_datasets().items():
        priced += price_rows(read_rows(path), label)[0]
    for source, (mape, rows) in optimum(priced).items():
        print(f"{source}: {100 * mape:.1f}% over {rows} rows")


if __name__ == "__main__":
    main()
