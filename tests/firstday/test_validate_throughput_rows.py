"""``rpeg validate``'s throughput-only rows (issue 41, item 7): rows that publish a tokens/s
and no step time (AReaL Fig 4, Fig 5c, Table 7) are not lines of the step-time tables, where
their +273..+680% errors stood unexplained among step-time errors; they have their own
summary per source, after the tables, that names the doc section explaining them."""

from __future__ import annotations

from rpeg.perf.validation.loso_report import lines, to_json
from rpeg.perf.validation.loso_summary import Scored


def _step(cid: str, measured: float, pred: float) -> Scored:
    return Scored(
        cid, "paper A", "verl-fsdp", "set", measured, pred_in=pred, lo_in=pred / 2,
        hi_in=pred * 2, pred_loso=pred, lo_loso=pred / 2, hi_loso=pred * 2,
    )  # fmt: skip


def _tput(cid: str, source: str, pred: float, measured: float) -> Scored:
    return Scored(cid, source, "areal", "set", None, pred_loso=1.0, tput=(pred, measured))


ROWS = [
    _step("step-row", 100.0, 110.0),
    _tput("fig-a", "paper B Fig 4", 400.0, 100.0),  # +300%
    _tput("fig-b", "paper B Fig 4", 600.0, 100.0),  # +500%
    _tput("fig-c", "paper B Fig 4", 250.0, 50.0),  # +400%
    _tput("tab-a", "paper B Table 7", 110.0, 100.0),  # +10%
]


def test_throughput_rows_leave_the_table_for_their_own_summary():
    out = lines(ROWS, [], ["set"])
    head = out.index(next(x for x in out if x.startswith("== throughput-only rows")))
    summary = out.index(next(x for x in out if x.startswith("== summary")))
    assert head < summary
    table = out[:head]
    assert any(x.startswith("step-row") for x in table)
    assert not any(x.startswith(("fig-", "tab-")) for x in out)  # no per-row lines
    assert "docs/validation.md 'Throughput-only rows'" in out[head]
    block = out[head + 1 : summary]
    assert block == [
        "  paper B Fig 4: 3 rows, median +400% (from +300% to +500%)",
        "  paper B Table 7: 1 rows, median +10% (from +10% to +10%)",
    ]


def test_no_throughput_rows_no_section():
    assert not any("throughput-only" in x for x in lines(ROWS[:1], [], ["set"]))


def test_json_rows_name_their_source():
    rows = to_json(ROWS, [], ["set"])["throughput_rows"]
    assert [(r["case_id"], r["source"]) for r in rows] == [
        ("fig-a", "paper B Fig 4"),
        ("fig-b", "paper B Fig 4"),
        ("fig-c", "paper B Fig 4"),
        ("tab-a", "paper B Table 7"),
    ]


def test_the_doc_explains_them():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "validation.md").read_text()
    assert "## Throughput-only rows" in doc
    section = doc.split("## Throughput-only rows", 1)[1].split("\n## ", 1)[0]
    assert "Fig 4" in section and "rpeg validate" in section
