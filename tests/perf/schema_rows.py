"""Rows in the shipped data sets' schema for tests: every column blank but the cells given."""

from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows


def schema_row(cells: dict[str, object], **over: object) -> dict[str, str]:
    """A row with the shipped schema's columns, blank but ``cells`` and then ``over`` (as
    strings)."""
    base = read_rows(loso.default_datasets()["steps_dev"])[0]
    r = dict.fromkeys(base, "")
    r.update({k: str(v) for k, v in {**cells, **over}.items()})
    return r
