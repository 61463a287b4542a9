"""Check the model against published step times (``rpeg validate``).

Each CSV row (schema of ``rpeg/perf/data/published_runs.csv``, the data set that ships with
rpeg; read by :mod:`rpeg.perf.validation.rows`) becomes a graph, a plan and a workload, is predicted with
the same ``predict`` a user calls, gets an interval from its unknown inputs, and is compared
with ``measured_step_s`` and the stage times where published.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rpeg.ir.graph import GraphError
from rpeg.perf.calibration import SHIPPED, Calibration
from rpeg.perf.interval import Unknowns, predict_interval
from rpeg.perf.prediction import StepPrediction
from rpeg.perf.validation.row_cells import (
    Unpredictable,
    cell_float,
    cell_int,
    cell_number,
    measured_step,
    one_line,
    unknown_names,
)
from rpeg.perf.validation.rows import PRIORS, RowCase, read_case, row_case  # noqa: F401 (re-exported)
from rpeg.perf.validation.solve import solve_row
from rpeg.plan.schema import InfeasiblePlan
from rpeg.specs import SpecError


def default_data() -> Path:
    """The published-runs data set shipped in the package."""
    return Path(str(resources.files("rpeg.perf").joinpath("data", "published_runs.csv")))


@dataclass
class RowResult:
    case_id: str
    source: str
    measured_step_s: float | None
    predicted_step_s: float | None = None
    predicted_low_s: float | None = None
    predicted_high_s: float | None = None
    reason: str = ""
    prediction: StepPrediction | None = None
    measured_throughput: float | None = None  # whole-cluster tokens/s where published
    solved: dict[str, Any] = field(default_factory=dict)  # blank layout fields -> value chosen
    unknown: tuple[str, ...] = ()  # blank inputs that took a prior (and widen the interval)
    # stage -> (predicted s, measured s) where the row publishes the stage's time
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def error(self) -> float | None:
        if self.predicted_step_s is None or not self.measured_step_s:
            return None
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def inside(self) -> bool | None:
        """Whether the measurement lies in [predicted_low_s, predicted_high_s]."""
        if self.error is None or self.predicted_low_s is None or self.predicted_high_s is None:
            return None
        return self.predicted_low_s <= self.measured_step_s <= self.predicted_high_s

    @property
    def width(self) -> float | None:
        """Interval width relative to the point prediction."""
        if self.predicted_step_s is None or self.predicted_low_s is None:
            return None
        return (self.predicted_high_s - self.predicted_low_s) / self.predicted_step_s


@dataclass
class Report:
    rows: list[RowResult] = field(default_factory=list)

    @property
    def compared(self) -> list[RowResult]:
        return [r for r in self.rows if r.error is not None]

    @property
    def skipped(self) -> list[RowResult]:
        return [r for r in self.rows if r.error is None]

    @property
    def mape(self) -> float:
        c = self.compared
        return 100.0 * sum(abs(r.error) for r in c) / len(c) if c else float("nan")

    @property
    def max_ape(self) -> float:
        c = self.compared
        return 100.0 * max(abs(r.error) for r in c) if c else float("nan")

    @property
    def coverage(self) -> float:
        """Share of compared rows whose measurement lies inside their interval."""
        c = [r.inside for r in self.compared if r.inside is not None]
        return sum(c) / len(c) if c else float("nan")

    @property
    def median_width(self) -> float:
        """Median interval width relative to the point prediction."""
        w = [r.width for r in self.compared if r.width is not None]
        return statistics.median(w) if w else float("nan")

    def stage_errors(self) -> dict[str, tuple[float, float, int]]:
        """stage -> (MAPE %, max abs error %, rows) over the rows publishing that stage."""
        out: dict[str, list[float]] = {}
        for r in self.rows:
            for st, (p, m) in r.stages.items():
                out.setdefault(st, []).append(abs(p - m) / m)
        return {k: (100 * sum(v) / len(v), 100 * max(v), len(v)) for k, v in out.items()}

    def by_source(self) -> dict[str, tuple[float, int]]:
        """source family -> (MAPE %, rows) over the step-time rows."""
        return {k: (v[0], v[2]) for k, v in self.by_source_max().items()}

    def by_source_max(self) -> dict[str, tuple[float, float, int]]:
        """source family -> (MAPE %, max abs error %, rows) over the step-time rows."""
        return _by_family((source_family(r.source), abs(r.error)) for r in self.compared)

    def throughput_by_source(self) -> dict[str, tuple[float, float, int]]:
        """source family -> (mean abs error %, max abs error %, rows) over the
        throughput-only rows (compared as whole-cluster tokens/s)."""
        fam = {r.case_id: source_family(r.source) for r in self.rows}
        return _by_family((fam[c], abs(p - m) / m) for c, p, m in self.throughput_rows())

    @property
    def not_predicted(self) -> list[RowResult]:
        """Rows with neither a step-time nor a throughput comparison, each with its reason."""
        return [r for r in self.skipped if not (r.measured_throughput and r.prediction)]

    def throughput_rows(self) -> list[tuple[str, float, float]]:
        """(case, predicted, measured) whole-cluster tokens/s for throughput-only rows."""
        out = []
        for r in self.rows:
            if r.measured_throughput and r.prediction and r.measured_step_s is None:
                p = r.prediction
                out.append((r.case_id, p.tokens_per_step / p.step_s, r.measured_throughput))
        return out


def _by_family(errors: Any) -> dict[str, tuple[float, float, int]]:
    """(family, abs relative error) pairs -> family -> (mean %, max %, count)."""
    out: dict[str, list[float]] = {}
    for fam, err in errors:
        out.setdefault(fam, []).append(err)
    return {k: (100.0 * sum(v) / len(v), 100.0 * max(v), len(v)) for k, v in out.items()}


def source_family(source: str) -> str:
    s = source.lower()
    if "nemo" in s:
        return "NeMo-RL"
    if "verl" in s:
        return "verl"
    if "areal" in s:
        return "AReaL"
    return source.split()[0] if source else "?"


#: columns a row cannot be predicted without (the rest have priors or are solved)
REQUIRED_COLUMNS = ("case_id", "model", "gpu")


def read_rows(path: str | Path | None = None) -> list[dict[str, str]]:
    """The rows of a CSV in the shipped data set's schema; a file that is not one (not UTF-8
    text, no rows, required columns missing) is a ConfigError naming the file and what is
    missing."""
    from rpeg.errors import ConfigError, Problem

    where = str(path or default_data())
    extra: list[int] = []  # lines with more cells than the header
    try:
        with open(path or default_data(), newline="", encoding="utf-8-sig") as fh:
            text = fh.read()
        # a spreadsheet's export: ';' or tab between cells when the header has no comma
        first = text.split("\n", 1)[0]
        delimiter = next((d for d in (";", "\t") if "," not in first and d in first), ",")
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
        rows = []
        for r in reader:
            if None in r:
                extra.append(reader.line_num)
            # a short row's missing trailing cells are blank
            rows.append({k: ("" if v is None else v) for k, v in r.items() if k is not None})
        header = list(reader.fieldnames or [])
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [Problem(where, f"not UTF-8 CSV text ({exc.reason})")], title="invalid data set"
        ) from None
    except csv.Error as exc:
        raise ConfigError(
            [Problem(where, f"not a readable CSV file: {exc}")], title="invalid data set"
        ) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    problems = []
    if missing:
        problems.append(
            Problem(
                where,
                f"missing column(s) {', '.join(missing)}; a data set needs "
                f"{', '.join(REQUIRED_COLUMNS)} (schema: the shipped published_runs.csv, "
                "docs/perf-model.md)",
            )
        )
    elif not rows:
        problems.append(Problem(where, "no rows under the header"))
    if extra:
        lines = ", ".join(map(str, extra[:10])) + (", ..." if len(extra) > 10 else "")
        problems.append(
            Problem(where, f"line(s) {lines}: more cells than the header's {len(header)} columns")
        )
    seen: dict[str, int] = {}
    dups = []
    for i, r in enumerate(rows):
        cid = (r.get("case_id") or "").strip()
        if cid and cid in seen:
            dups.append(f"{cid!r} (data rows {seen[cid] + 1} and {i + 1})")
        seen.setdefault(cid, i)
    if dups:
        problems.append(
            Problem(where, f"case_id repeated: {', '.join(dups[:10])}; each row needs its own")
        )
    if problems:
        raise ConfigError(problems, title="invalid data set")
    return rows


def _other(r: dict[str, str], key: str) -> float | None:
    """A ``key=value`` entry of the ``measured_other`` column."""
    m = re.search(rf"(?:^|[;\s]){re.escape(key)}\s*=\s*([\d.]+)", r.get("measured_other") or "")
    return float(m.group(1)) if m else None


def published_throughput(r: dict[str, str]) -> float | None:
    """Whole-cluster tokens/s where the row publishes a throughput: AReaL's effective
    training throughput, or NeMo-RL/verl tokens/s/GPU x the row's GPUs."""
    v = _other(r, "effective_train_throughput_tok_s")
    if v:
        return v
    v = _other(r, "tokens_per_s_per_gpu")
    if not v or cell_number(r, "num_gpus") is None:
        return None
    return v * cell_int(r, "num_gpus")  # a bad count is named as itself, not as a throughput


def _stage_times(r: dict[str, str], case: RowCase, pred: StepPrediction) -> dict:
    """(predicted, measured) per stage the row publishes. The generation time counts only
    where it is the rollout's own duration: synchronous rows, or disaggregated rows whose
    rollout pool is measured (``measured_gen_kind`` blank or ``rollout``; ``wait`` = the
    trainer's wait for samples, not comparable)."""
    out: dict[str, tuple[float, float]] = {}

    def unit_time(kind: str) -> float | None:
        t = [s.time_s for s in pred.stages.values() if kind in s.kinds]
        return sum(t) if t else None

    kind = (r.get("measured_gen_kind") or "rollout").strip().lower()
    gen = cell_float(r, "measured_gen_s")
    if gen and kind == "rollout":
        p = unit_time("generate")
        if p:
            out["generate"] = (p, gen)
    train = cell_float(r, "measured_train_s")
    if train:
        p = unit_time("train_actor")
        if p:
            out["train_actor"] = (p, train)
    olp = _other(r, "old_log_prob_s")
    if olp:
        p = unit_time("old_logprob")
        if p:
            out["old_logprob"] = (p, olp)
    return out


def validate_rows(
    rows: list[dict[str, str]], calib: Calibration = SHIPPED, intervals: bool = True
) -> Report:
    rep = Report()
    for r in rows:
        res = RowResult(
            case_id=r.get("case_id") or "?", source=r.get("source") or "", measured_step_s=None
        )
        rep.rows.append(res)
        try:
            step = measured_step(r)
            res.measured_step_s = step
            res.measured_throughput = published_throughput(r)
        except Unpredictable as exc:
            res.reason = f"measurement unreadable: {exc}"
            continue
        if res.measured_step_s is None and res.measured_throughput is None:
            res.reason = "no measured_step_s"
            continue
        bad = unknown_names(r)
        if bad:
            res.reason = bad
            continue
        try:
            case = read_case(r)
            case, lay, pred = solve_row(case, calib)
            res.solved = lay.solved
            res.unknown = case.unknown
            if intervals:
                lo, hi = predict_interval(
                    case.graph,
                    case.plan(lay),
                    case.workload,
                    calib,
                    Unknowns.of(case.unknown),
                    point=pred.step_s,
                )
                res.predicted_low_s, res.predicted_high_s = lo, hi
        except Unpredictable as exc:
            res.reason = str(exc)
            continue
        except (ValueError, GraphError) as exc:  # a config the plan/graph validators refuse
            res.reason = "row describes an invalid plan: " + one_line(exc)
            continue
        except InfeasiblePlan as exc:
            res.reason = f"model says infeasible: {exc}"
            continue
        except SpecError as exc:
            res.reason = str(exc).replace("\n", " ")
            continue
        res.prediction = pred
        res.predicted_step_s = pred.step_s
        res.stages = _stage_times(r, case, pred)
        if res.measured_step_s is None:
            res.reason = "throughput-only row (no step time): compared as tokens/s"
    return rep


def validate_csv(
    path: str | Path | None = None, calib: Calibration = SHIPPED, intervals: bool = True
) -> Report:
    """Validate a CSV (default: the shipped data set)."""
    return validate_rows(read_rows(path), calib, intervals)
