"""Prefect artifacts and step logs for RL runs: call these from a flow (or a task in it).

Every helper is a no-op returning ``None`` outside a Prefect flow or task run (plain Python,
``rpeg train --local``), never raises on an API hiccup (an artifact is not worth a failed
training step: failures are logged at WARNING), and returns the artifact id otherwise.
Keys must be lowercase letters, digits and dashes (:func:`artifact_key` makes one).

Per step (cheap: one API call to update the progress bar, one log line)::

    from rpeg.flows.artifacts import publish_step
    for step in range(start, total):
        m = ...                                   # the step's metrics (floats)
        publish_step(step + 1, total, m)          # progress artifact + "step 3/20 reward=..." log

At the end (or every N steps)::

    publish_metrics_table(history)                # one row per step, the run's main metrics
    publish_checkpoint(url, step)                 # link artifact to the committed checkpoint
    publish_timeline(records, "runs/x/timeline.png", predicted=pred_records)
    publish_plan_report(markdown)                 # the ``rpeg plan`` report
    publish_summary(summary)                      # the summary dict as a markdown table

Functions
---------
``in_prefect_run() -> bool``
``artifact_key(*parts) -> str``
``publish_step(step, total_steps, metrics, *, key=None, log=True) -> UUID | None``
``publish_metrics_table(history, *, key=None, columns=None, description=None) -> UUID | None``
``publish_checkpoint(url, step, *, key=None, score=None, description=None) -> UUID | None``
``publish_plan_report(markdown, *, key=None) -> UUID | None``  (markdown text or a path to .md)
``publish_timeline(measured, image_path, *, predicted=None, key=None, title="") -> UUID | None``
``publish_summary(summary, *, key=None, title="Run summary") -> UUID | None``
``publish_markdown(markdown, *, key=None, description=None) -> UUID | None``
``MetricsWatcher(path, total_steps, start_step=0)`` -- a thread that tails a metrics.jsonl
written by another component and calls :func:`publish_step` for each new line.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

log = logging.getLogger("rpeg.flows.artifacts")

# metrics shown in the per-step log line and the table, in this order, when present
MAIN_METRICS = (
    "reward_mean",
    "accuracy",
    "response_length",
    "kl",
    "pg_loss",
    "clip_frac",
    "entropy",
    "staleness_max",
    "step_s",
    "tokens_per_s",
)

# (flow run id, key) -> progress artifact id, so publish_step creates the bar once per run
_PROGRESS: dict[tuple[str, str], UUID] = {}
_LOCK = threading.Lock()


# ---------------------------------------------------------------------- context
def _run_context() -> Any:
    try:
        from prefect.context import FlowRunContext, TaskRunContext
    except ImportError:  # pragma: no cover - prefect is a dependency
        return None
    return TaskRunContext.get() or FlowRunContext.get()


def in_prefect_run() -> bool:
    """True inside a Prefect flow run or task run (artifacts attach to it)."""
    return _run_context() is not None


def _flow_run_id() -> str:
    from prefect.context import FlowRunContext, TaskRunContext

    fctx = FlowRunContext.get()
    if fctx is not None and fctx.flow_run is not None:
        return str(fctx.flow_run.id)
    tctx = TaskRunContext.get()
    if tctx is not None:
        return str(tctx.task_run.flow_run_id)
    return "none"


def _flow_name() -> str:
    from prefect.context import FlowRunContext

    fctx = FlowRunContext.get()
    return fctx.flow.name if fctx is not None and fctx.flow is not None else "rpeg"


def artifact_key(*parts: Any) -> str:
    """A valid artifact key from ``parts`` (lowercase letters, digits, dashes)."""
    s = "-".join(str(p) for p in parts if p not in (None, ""))
    s = re.sub(r"[^a-z0-9-]+", "-", s.lower()).strip("-")
    return re.sub(r"-{2,}", "-", s) or "rpeg"


def _default_key(kind: str) -> str:
    return artifact_key(_flow_name(), kind)


def _run_logger() -> Any:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run
        return log


def _safe(what: str, fn, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - artifacts never fail a run
        log.warning("could not publish %s artifact: %s: %s", what, type(exc).__name__, exc)
        return None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


# ---------------------------------------------------------------------- per step
def format_step_line(step: int, total_steps: int, metrics: Mapping[str, Any]) -> str:
    """``step 3/20 reward_mean=0.41 accuracy=0.38 ... step_s=0.62``."""
    keys = [k for k in MAIN_METRICS if k in metrics]
    keys += sorted(
        k
        for k in metrics
        if k not in MAIN_METRICS and k != "step" and isinstance(metrics[k], int | float)
    )
    body = " ".join(f"{k}={_fmt(metrics[k])}" for k in keys[:16])
    return f"step {step}/{total_steps} {body}".rstrip()


def publish_step(
    step: int,
    total_steps: int,
    metrics: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    log_line: bool = True,
) -> UUID | None:
    """Report that ``step`` of ``total_steps`` steps is done (``step`` counts from 1).

    Creates the run's progress artifact on the first call (keyed per flow run and ``key``)
    and updates it afterwards; logs the step's metrics through the Prefect run logger, so
    they appear in the flow run's logs in the UI. Returns the progress artifact id.
    """
    if not in_prefect_run():
        return None
    metrics = metrics or {}
    if log_line:
        _run_logger().info(format_step_line(step, total_steps, metrics))
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    pct = 100.0 * min(max(step, 0), max(total_steps, 1)) / max(total_steps, 1)
    k = key or _default_key("progress")
    rid = _flow_run_id()
    desc = f"step {step}/{total_steps}"
    if "reward_mean" in metrics:
        desc += f", reward {_fmt(metrics['reward_mean'])}"
    with _LOCK:
        aid = _PROGRESS.get((rid, k))
        if aid is None:
            aid = _safe("progress", create_progress_artifact, progress=pct, key=k, description=desc)
            if aid is not None:
                _PROGRESS[(rid, k)] = aid
            return aid
    return _safe(
        "progress", update_progress_artifact, artifact_id=aid, progress=pct, description=desc
    )


def progress_artifact_id(key: str | None = None) -> UUID | None:
    """The id of this flow run's progress artifact (after a :func:`publish_step`)."""
    if not in_prefect_run():
        return None
    return _PROGRESS.get((_flow_run_id(), key or _default_key("progress")))


# ---------------------------------------------------------------------- tables, links
def publish_metrics_table(
    history: Sequence[Mapping[str, Any]],
    *,
    key: str | None = None,
    columns: Sequence[str] | None = None,
    description: str | None = None,
    max_rows: int = 500,
) -> UUID | None:
    """One row per step with ``columns`` (default: step + the main metrics present)."""
    if not in_prefect_run() or not history:
        return None
    from prefect.artifacts import create_table_artifact

    if columns is None:
        present = set().union(*(h.keys() for h in history))
        columns = ["step"] + [k for k in MAIN_METRICS if k in present]
    rows = []
    hist = list(history)
    if len(hist) > max_rows:  # keep the first and the newest rows
        hist = hist[: max_rows // 5] + hist[-(max_rows - max_rows // 5) :]
    for h in hist:
        row = {}
        for c in columns:
            v = h.get(c)
            if c == "step" and isinstance(v, float):
                v = int(v) + 1  # runtime metrics count steps from 0; the table from 1
            elif isinstance(v, float):
                v = None if math.isnan(v) else round(v, 6)
            row[c] = v
        rows.append(row)
    return _safe(
        "table",
        create_table_artifact,
        table=rows,
        key=key or _default_key("metrics"),
        description=description or f"per-step metrics ({len(history)} steps)",
    )


def publish_checkpoint(
    url: str,
    step: int,
    *,
    key: str | None = None,
    score: float | None = None,
    description: str | None = None,
) -> UUID | None:
    """A link artifact to a committed checkpoint (``url`` = its folder or fsspec URL)."""
    if not in_prefect_run():
        return None
    from prefect.artifacts import create_link_artifact

    link = url if "://" in url else Path(url).resolve().as_uri()
    text = f"checkpoint step {step}" + (f" (score {_fmt(score)})" if score is not None else "")
    return _safe(
        "link",
        create_link_artifact,
        link=link,
        link_text=text,
        key=key or _default_key("checkpoint"),
        description=description or text,
    )


def publish_markdown(
    markdown: str, *, key: str | None = None, description: str | None = None
) -> UUID | None:
    if not in_prefect_run():
        return None
    from prefect.artifacts import create_markdown_artifact

    return _safe(
        "markdown", create_markdown_artifact, markdown=markdown, key=key, description=description
    )


def publish_plan_report(markdown: str | Path, *, key: str | None = None) -> UUID | None:
    """The ``rpeg plan`` report (markdown text, or the path of a .md file)."""
    if isinstance(markdown, Path) or (
        isinstance(markdown, str) and "\n" not in markdown and markdown.endswith(".md")
    ):
        try:
            markdown = Path(markdown).read_text()
        except OSError as exc:
            markdown = f"plan report not readable: {exc}"
    return publish_markdown(
        str(markdown), key=key or _default_key("plan"), description="execution plan report"
    )


def summary_markdown(summary: Mapping[str, Any], title: str = "Run summary") -> str:
    lines = [f"# {title}", "", "| metric | value |", "| --- | --- |"]
    for k, v in summary.items():
        if k.startswith("_") or isinstance(v, dict | list):
            continue
        lines.append(f"| {k} | {_fmt(v)} |")
    return "\n".join(lines) + "\n"


def publish_summary(
    summary: Mapping[str, Any], *, key: str | None = None, title: str = "Run summary"
) -> UUID | None:
    return publish_markdown(
        summary_markdown(summary, title), key=key or _default_key("summary"), description=title
    )


def publish_timeline(
    measured: Iterable[Any] | None,
    image_path: str | Path,
    *,
    predicted: Iterable[Any] | None = None,
    key: str | None = None,
    title: str = "",
) -> UUID | None:
    """Draw the measured (and predicted) step timeline with :func:`rpeg.perf.timeline.gantt`
    to ``image_path`` and publish a markdown artifact naming the image and the stage times.

    ``measured``/``predicted`` are :class:`rpeg.perf.timeline.TimelineRecord` s or their dicts;
    with ``measured=None`` an existing image at ``image_path`` is only referenced. The UI does
    not serve local files: the artifact carries the path (and ``file://`` URI) to open.
    """
    if not in_prefect_run():
        return None
    from rpeg.perf.timeline import TimelineRecord, gantt

    def _recs(items: Iterable[Any] | None) -> list[TimelineRecord]:
        out = []
        for r in items or []:
            rec = r if isinstance(r, TimelineRecord) else TimelineRecord.from_dict(dict(r))
            out.append(rec)
        return out

    meas, pred = _recs(measured), _recs(predicted)
    path = Path(image_path)
    if meas or pred:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            both = [
                TimelineRecord(
                    r.stage,
                    f"{r.source or 'measured'} {r.device_group}",
                    r.start_s,
                    r.end_s,
                    r.step,
                    r.kind,
                    r.source,
                )
                for r in pred + meas
            ]
            gantt(both, str(path), title=title or "measured vs predicted step timeline")
        except Exception as exc:  # noqa: BLE001
            log.warning("could not draw the timeline: %s", exc)
    lines = ["# Step timeline", "", f"image: `{path.resolve()}` ({path.resolve().as_uri()})", ""]
    for label, recs in (("predicted", pred), ("measured", meas)):
        if not recs:
            continue
        by: dict[str, float] = {}
        for r in recs:
            by[r.stage] = by.get(r.stage, 0.0) + r.duration_s
        lines += [f"## {label}", "", "| stage | seconds |", "| --- | --- |"]
        lines += [f"| {s} | {_fmt(t)} |" for s, t in sorted(by.items(), key=lambda kv: -kv[1])]
        lines.append("")
    return publish_markdown(
        "\n".join(lines), key=key or _default_key("timeline"), description="step timeline"
    )


# ---------------------------------------------------------------------- watcher
class MetricsWatcher:
    """Tail a ``metrics.jsonl`` (one JSON object per step, ``step`` counting from 0) written
    by another component in this process or another one, and :func:`publish_step` every new
    step. Start it inside a flow run (it captures the run context), ``stop()`` at the end.
    Rewritten files (the runtime rewrites metrics.jsonl whole) are handled by step number.
    """

    def __init__(
        self,
        path: str | Path,
        total_steps: int,
        *,
        start_step: int = 0,
        interval_s: float = 1.0,
        key: str | None = None,
        not_before: float | None = None,
    ):
        self.path = Path(path)
        self.not_before = not_before  # ignore a file last written before this (a previous run's)
        self.total_steps = total_steps
        self.seen = start_step
        self.interval_s = interval_s
        self.key = key
        self.history: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx = None

    def start(self) -> MetricsWatcher:
        if not in_prefect_run():
            return self
        import contextvars

        self._ctx = contextvars.copy_context()
        self._thread = threading.Thread(
            target=lambda: self._ctx.run(self._loop), name="rpeg-metrics-watcher", daemon=True
        )
        self._thread.start()
        return self

    def poll(self) -> int:
        """Publish steps written since the last poll; returns how many."""
        try:
            if self.not_before is not None and self.path.stat().st_mtime < self.not_before - 1.0:
                return 0
            text = self.path.read_text()
        except OSError:
            return 0
        rows = []
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line being written
        n = 0
        for m in rows:
            s = int(m.get("step", -1)) + 1
            if s > self.seen:
                self.seen = s
                self.history.append(m)
                publish_step(s, self.total_steps, m, key=self.key)
                n += 1
        return n

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._ctx is not None:
                self._ctx.run(self.poll)

    def __enter__(self) -> MetricsWatcher:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = [
    "MAIN_METRICS",
    "MetricsWatcher",
    "artifact_key",
    "format_step_line",
    "in_prefect_run",
    "progress_artifact_id",
    "publish_checkpoint",
    "publish_markdown",
    "publish_metrics_table",
    "publish_plan_report",
    "publish_step",
    "publish_summary",
    "publish_timeline",
    "summary_markdown",
]
