"""The shipped system table (rpeg/perf/data/systems.yaml): each system's factors fitted on
all shipped published runs and its range from its rows' leave-one-source-out residuals.
Refit with ``python -m rpeg.perf.validation.systems_fit --write`` after a data set changes; read by
:func:`rpeg.perf.systems.shipped`."""

from __future__ import annotations

import math
from pathlib import Path

from rpeg.perf.systems import POOLED, SystemParams
from rpeg.perf.validation.loso import (
    Priced,
    default_datasets,
    per_step,
    price_rows,
    score,
    share_of,
)
from rpeg.perf.validation.loso_fit import fit_lengths
from rpeg.perf.validation.loso_ranges import MIN_COMPARABLE, conformal_range


def system_table(priced: list[Priced]) -> dict[str, SystemParams]:
    """The shipped factors: fitted on all rows, ranges from the LOSO residuals."""
    steps = [p for p in priced if p.measured_s]
    _, full = fit_lengths(per_step(steps, share_of(steps)))
    scored = {s.case_id: s for s in score(priced)}
    resid = {
        p.case_id: math.log(p.measured_s / scored[p.case_id].pred_loso)  # type: ignore[operator]
        for p in steps
    }
    table = {}
    for name, (lg, lt) in full.items():
        mine = [p for p in steps if p.system == name] if name != POOLED else steps
        pool = [resid[q.case_id] for q in mine]
        if name == POOLED or len(pool) < MIN_COMPARABLE:
            pool = list(resid.values())
        lo, hi = conformal_range(pool, 1.0)
        table[name] = SystemParams(
            name=name,
            gen_eff=round(math.exp(lg), 3),
            train_eff=round(math.exp(lt), 3),
            resid_lo=round(lo, 3),
            resid_hi=round(hi, 3),
            sources=len({p.source for p in mine}),
            rows=len(mine),
        )
    return table


def write_table(path: Path | None = None) -> Path:
    """Fit on both shipped data sets and write ``rpeg/perf/data/systems.yaml``."""
    import yaml

    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.validation.loso_lengths import describe
    from rpeg.perf.validation.published import read_rows

    priced = []
    for label, p in default_datasets().items():
        priced += price_rows(read_rows(p), label)[0]
    table = system_table(priced)
    steps = [p for p in priced if p.measured_s]
    lengths = describe(fit_lengths(per_step(steps, share_of(steps)))[0], SHIPPED)
    path = path or default_datasets()["steps_dev"].with_name("systems.yaml")
    body = {
        "systems": {
            n: {
                k: getattr(v, k)
                for k in ("gen_eff", "train_eff", "resid_lo", "resid_hi", "sources", "rows")
            }
            for n, v in sorted(table.items())
        },
        # the response-length medians (tokens) fitted on all rows of unpublished length
        # (rpeg.perf.validation.loso_lengths); the documented priors are in rpeg.perf.calibration
        "fitted_length_medians": lengths,
    }
    header = (
        "# Fitted by `python -m rpeg.perf.validation.systems_fit --write` on the shipped published runs (both\n"
        "# data sets). gen_eff/train_eff: achieved share of the modelled rollout / training\n"
        "# rate; resid_lo/hi: split-conformal log half-width (85%) of the system's rows scored\n"
        "# leave-one-source-out (the range of a prediction). docs/perf-model.md, 'Systems'.\n"
    )
    path.write_text(header + yaml.safe_dump(body, sort_keys=True))
    return path


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import sys

    if "--write" in sys.argv:
        print(write_table())
