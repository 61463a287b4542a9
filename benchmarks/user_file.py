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
