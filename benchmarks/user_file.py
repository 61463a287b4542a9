"""What the unseen-family benchmarks share (``unseen_family_*.py``): a row in the shared schema
as a user writes it, and rows scored as ``rpeg validate FILE`` scores a user's file --
leave-one-source-out with the shipped sets joining the fit -- as its JSON report."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path
from typing import Any

from rpeg.perf.validation import loso
from rpeg.perf.validation.loso_report import to_json
from rpeg.perf.validation.published import read_rows


def blank_row(**cells: str) -> dict[str, str]:
    """A row of the shared schema's columns (../shared/validation), blank but ``cells``."""
    header = list(read_rows(loso.shared_copies()["steps_dev (shared schema)"])[0])
    return {**dict.fromkeys(header, ""), **cells}


def score(rows: list[dict[str, str]], label: str) -> dict[str, Any]:
    """``rows`` written to a CSV and scored as ``rpeg validate FILE --json`` reports them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{label}.csv"
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        scored, refused = loso.run({label: path, **loso.default_datasets()})
        return to_json(scored, refused, [label])


def print_scored(out: dict[str, Any], width: int = 30) -> dict[str, list[float]]:
    """Each scored row of ``out`` (a :func:`score` report) on a line -- measured, LOSO
    prediction and range, error, what was solved -- then the rows not predicted, with why.
    Returns the absolute percentage errors by system."""
    errs: dict[str, list[float]] = {}
    for r in out["rows"]:
        m, p = r["measured_step_s"], r["loso_step_s"]
        if p is None:
            print(f"{r['case_id']:{width}s} not predicted")
            continue
        err = 100 * (p - m) / m
        errs.setdefault(r["system"], []).append(abs(err))
        print(
            f"{r['case_id']:{width}s} {r['system'] or '-':18s} measured {m:8.1f} s  LOSO {p:8.1f} s "
            f"({r['loso_low_s']:.0f}-{r['loso_high_s']:.0f})  {err:+6.1f}%  solved {r['solved']}"
        )
    for sk in out["skipped"]:
        print(f"{sk['case_id']:{width}s} not predicted: {sk['reason']}")
    return errs


def summary(out: dict[str, Any]) -> str:
    """The SUMMARY line's common part: rows, predicted, LOSO MAPE, coverage, median width."""
    lo = out["loso"]
    return (
        f"SUMMARY rows={lo['rows']} predicted={lo['predicted']} LOSO MAPE={lo['mape']:.1f}% "
        f"coverage={100 * lo['coverage']:.0f}% median_width={100 * lo['median_width']:.0f}%"
    )
