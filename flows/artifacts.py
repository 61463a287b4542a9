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

At the end, once per run (from the flow that owns the run, never from a subflow too)::

    publish_results(summary, out_dir, predicted=pred_records)   # table + summary page with
                                                  # the curve and the Gantt chart
    publish_checkpoint(url, step)                 # the checkpoint location, as text
    publish_plan_report(markdown)                 # the plan report (rpeg.flows.reports)
    publish_refused(reason)                       # a run whose parameters were refused

Pictures (the reward/accuracy curve, the predicted-vs-measured Gantt chart, the step
graph) are embedded as ``data:`` URIs in markdown artifacts: the Prefect UI renders them and
serves no local files. Paths are shown as text, never as ``file://`` links.

Functions
---------
``in_prefect_run() -> bool``
``artifact_key(*parts) -> str``
``publish_step(step, total_steps, metrics, *, key=None, log_line=True) -> UUID | None``
``publish_metrics_table(history, *, key=None, columns=None, description=None) -> UUID | None``
``publish_checkpoint(url, step, *, key=None, score=None, description=None) -> UUID | None``
``publish_plan_report(markdown, *, key=None) -> UUID | None``  (markdown text or a path to .md)
``publish_timeline(measured, image_path=None, *, predicted=None, key=None) -> UUID | None``
``publish_curve(history, *, heldout=(None, None), image_path=None, key=None) -> UUID | None``
``results_markdown(summary, history, *, measured=None, predicted=None, out_dir=None) -> str``
``publish_summary(summary, *, key=None, title="Run summary", out_dir=None) -> UUID | None``
``publish_results(summary, out_dir=None, *, predicted=None, history=None, timeline=None)``
``publish_refused(reason, *, key=None) -> UUID | None``
``publish_markdown(markdown, *, key=None, description=None) -> UUID | None``
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

from rpeg.flows.api_calls import api_call

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

# columns of the metrics table (fewer than the log line, so the table fits the page)
TABLE_METRICS = (
    "reward_mean",
    "accuracy",
    "response_length",
    "kl",
    "pg_loss",
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
            aid = api_call(
                "progress", create_progress_artifact, progress=pct, key=k, description=desc
            )
            if aid is not None:
                _PROGRESS[(rid, k)] = aid
            return aid
    return api_call(
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
        columns = ["step"] + [k for k in TABLE_METRICS if k in present]
    rows = []
    hist = list(history)
    if len(hist) > max_rows:  # keep the first and the newest rows
        hist = hist[: max_rows // 5] + hist[-(max_rows - max_rows // 5) :]
    for h in hist:
        row = {}
        for c in columns:
            v = h.get(c)
            if c == "step" and isinstance(v, int | float):
                v = int(v)  # 1-based, as the console counts
            elif isinstance(v, float):
                v = None if math.isnan(v) else float(f"{v:.4g}")
            row[c] = v
        rows.append(row)
    return api_call(
        "table",
        create_table_artifact,
        table=rows,
        key=key or _default_key("metrics"),
        description=description or f"per-step metrics ({len(history)} steps)",
    )


def publish_samples(
    rows: Sequence[Mapping[str, Any]], step: int, *, key: str | None = None
) -> UUID | None:
    """A table of a logged step's samples (rpeg.runtime.samples.table_rows: prompt, response,
    reference answer, reward, advantage, length, policy version), replaced at every logged
    step under one key (the newest samples; all of them are in samples.jsonl)."""
    if not in_prefect_run() or not rows:
        return None
    from prefect.artifacts import create_table_artifact

    return api_call(
        "table",
        create_table_artifact,
        table=[dict(r) for r in rows],
        key=key or _default_key("samples"),
        description=f"samples of step {step} (all logged samples: samples.jsonl)",
    )


def location_text(url: str) -> str:
    """A checkpoint or file location as markdown text: the path (or URL) in code font, and a
    link only for http(s) URLs (a browser opens no ``file://`` link from an http page)."""
    text = url if "://" in url else str(Path(url).resolve())
    if url.startswith(("http://", "https://")):
        return f"[`{text}`]({url})"
    return f"`{text}`"


def publish_checkpoint(
    url: str,
    step: int,
    *,
    key: str | None = None,
    score: float | None = None,
    description: str | None = None,
) -> UUID | None:
    """A markdown artifact naming a committed checkpoint (its folder or fsspec URL as text)."""
    if not in_prefect_run():
        return None
    text = f"checkpoint step {step}" + (f" (score {_fmt(score)})" if score is not None else "")
    return publish_markdown(
        f"# {text}\n\n{location_text(url)}\n",
        key=key or _default_key("checkpoint"),
        description=description or f"{text}: {url}",
    )


def publish_markdown(
    markdown: str, *, key: str | None = None, description: str | None = None
) -> UUID | None:
    if not in_prefect_run():
        return None
    from prefect.artifacts import create_markdown_artifact

    return api_call(
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


def summary_markdown(
    summary: Mapping[str, Any], title: str = "Run summary", out_dir: str | Path | None = None
) -> str:
    lines = [f"# {title}", "", "| metric | value |", "| --- | --- |"]
    for k, v in summary.items():
        if k.startswith("_") or isinstance(v, dict | list):
            continue
        lines.append(f"| {k} | {_fmt(v)} |")
    if out_dir is not None:
        lines += ["", f"output folder: {location_text(str(out_dir))}"]
    return "\n".join(lines) + "\n"


def publish_summary(
    summary: Mapping[str, Any],
    *,
    key: str | None = None,
    title: str = "Run summary",
    out_dir: str | Path | None = None,
) -> UUID | None:
    return publish_markdown(
        summary_markdown(summary, title, out_dir),
        key=key or _default_key("summary"),
        description=title,
    )


def _saved(image_path: str | Path | None, png: bytes) -> list[str]:
    if image_path is None:
        return []
    saved = _safe("picture file", _write_bytes, image_path, png)
    return [f"saved as {location_text(str(saved))}", ""] if saved is not None else []


def timeline_section(
    measured: Iterable[Any] | None,
    predicted: Iterable[Any] | None = None,
    image_path: str | Path | None = None,
) -> list[str]:
    """Markdown lines: the one-step Gantt chart (predicted and measured rows) as an
    embedded image, and the seconds per stage."""
    from rpeg.flows import reports

    meas, pred = list(measured or []), list(predicted or [])
    png = _safe("timeline picture", reports.gantt_png, meas, pred)
    lines = ["## Step timeline: predicted vs measured", ""]
    if png:
        lines += [reports.image_markdown(png, "predicted vs measured Gantt chart"), ""]
        lines += _saved(image_path, png)
    lines += reports.stage_seconds_markdown("predicted seconds per stage", pred)
    lines += reports.stage_seconds_markdown("measured seconds per stage", meas)
    return lines


def curve_section(
    history: Sequence[Mapping[str, Any]],
    heldout: tuple[float | None, float | None] = (None, None),
    image_path: str | Path | None = None,
) -> list[str]:
    """Markdown lines: reward and accuracy per step as an embedded image."""
    from rpeg.flows import reports

    png = _safe("curve picture", reports.curve_png, history, heldout=heldout)
    if not png:
        return []
    lines = ["## Reward and accuracy", "", reports.image_markdown(png, "reward and accuracy"), ""]
    lines += _saved(image_path, png)
    before, after = heldout
    if before is not None or after is not None:
        lines += [f"held-out accuracy: {_fmt(before)} before, {_fmt(after)} after training", ""]
    return lines


def publish_timeline(
    measured: Iterable[Any] | None,
    image_path: str | Path | None = None,
    *,
    predicted: Iterable[Any] | None = None,
    key: str | None = None,
) -> UUID | None:
    """The step timeline alone (:func:`timeline_section`) as a markdown artifact."""
    if not in_prefect_run():
        return None
    return publish_markdown(
        "\n".join(timeline_section(measured, predicted, image_path)),
        key=key or _default_key("timeline"),
        description="step timeline",
    )


def _write_bytes(path: str | Path, data: bytes) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def publish_curve(
    history: Sequence[Mapping[str, Any]],
    *,
    heldout: tuple[float | None, float | None] = (None, None),
    image_path: str | Path | None = None,
    key: str | None = None,
) -> UUID | None:
    """The reward/accuracy curve alone (:func:`curve_section`) as a markdown artifact."""
    if not in_prefect_run() or not history:
        return None
    lines = curve_section(history, heldout, image_path)
    if not lines:
        return None
    return publish_markdown(
        "\n".join(lines), key=key or _default_key("curve"), description="reward/accuracy curve"
    )


def publish_refused(reason: str, *, key: str | None = None) -> UUID | None:
    """The ``refused`` artifact of a run whose parameters or config were refused."""
    return publish_markdown(
        f"# Run refused\n\nNothing was started:\n\n```\n{reason}\n```\n",
        key=key or _default_key("refused"),
        description=reason[:500],
    )


def results_markdown(
    summary: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    *,
    measured: Iterable[Any] | None = None,
    predicted: Iterable[Any] | None = None,
    out_dir: str | Path | None = None,
) -> str:
    """The run's summary page: the numbers, the reward/accuracy curve and the
    predicted-vs-measured Gantt chart (pictures embedded), the output folder as text."""
    out = Path(out_dir) if out_dir is not None else None
    heldout = (summary.get("heldout_acc_before"), summary.get("heldout_acc_after"))
    lines = ["# Run summary", ""]
    lines += curve_section(history, heldout, out and out / "reward_curve.png")  # as --local
    meas, pred = list(measured or []), list(predicted or [])
    if meas or pred:
        lines += timeline_section(meas, pred, out and out / "timeline.png")
    lines.append(summary_markdown(summary, "", out).replace("# \n\n", "## Numbers\n\n", 1))
    return "\n".join(lines)


def publish_results(
    summary: Mapping[str, Any],
    out_dir: str | Path | None = None,
    *,
    predicted: Iterable[Any] | None = None,
    history: Sequence[Mapping[str, Any]] | None = None,
    timeline: Iterable[Any] | None = None,
) -> None:
    """Everything a finished run publishes, once: the metrics table (``<flow>-metrics``)
    and the summary page (``<flow>-summary``: numbers, curve, Gantt chart). ``history`` and
    ``timeline`` default to ``summary["_extra"]`` (the runtime's) or the files in
    ``out_dir`` (``metrics.jsonl``, ``timeline.json``); the pictures are saved there too."""
    if not in_prefect_run():
        return
    from rpeg.flows import reports

    extra = summary.get("_extra") or {}
    out = Path(out_dir) if out_dir is not None else None
    if history is None:
        history = extra.get("history")
    if history is None and out is not None:
        history = _read_jsonl(out / "metrics.jsonl")
    if timeline is None:
        timeline = extra.get("timeline")
    if timeline is None and out is not None:
        timeline = _read_timeline(out / "timeline.json")
    history = list(history or [])
    publish_metrics_table(history)
    measured = _safe("timeline", reports.last_step_records, timeline or []) or []
    md = results_markdown(summary, history, measured=measured, predicted=predicted, out_dir=out)
    before, after = summary.get("heldout_acc_before"), summary.get("heldout_acc_after")
    publish_markdown(
        md,
        key=_default_key("summary"),
        description=f"{summary.get('steps', len(history))} steps; held-out accuracy "
        f"{_fmt(before)} -> {_fmt(after)}; curve and timeline inside",
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]] | None:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return None


def _read_timeline(path: Path) -> list[dict[str, Any]] | None:
    try:
        return json.loads(path.read_text())["records"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------- watcher
__all__ = [
    "MAIN_METRICS",
    "TABLE_METRICS",
    "artifact_key",
    "format_step_line",
    "in_prefect_run",
    "progress_artifact_id",
    "location_text",
    "publish_checkpoint",
    "publish_curve",
    "publish_refused",
    "publish_results",
    "results_markdown",
    "curve_section",
    "timeline_section",
    "publish_markdown",
    "publish_metrics_table",
    "publish_plan_report",
    "publish_step",
    "publish_summary",
    "publish_timeline",
    "summary_markdown",
]
