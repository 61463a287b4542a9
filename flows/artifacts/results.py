"""A finished run's results page: the reward/accuracy curve and the predicted-vs-measured
Gantt chart (pictures embedded as ``data:`` URIs, saved beside the run's outputs), the
numbers, and the metrics table -- published once (:func:`publish_results`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from rpeg.flows.artifacts.context import default_key, fmt_value, in_prefect_run, safely
from rpeg.flows.artifacts.pages import location_text, publish_markdown, summary_markdown
from rpeg.flows.artifacts.steps import publish_metrics_table


def _saved(image_path: str | Path | None, png: bytes) -> list[str]:
    if image_path is None:
        return []
    saved = safely("picture file", _write_bytes, image_path, png)
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
    png = safely("timeline picture", reports.gantt_png, meas, pred)
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

    png = safely("curve picture", reports.curve_png, history, heldout=heldout)
    if not png:
        return []
    lines = ["## Reward and accuracy", "", reports.image_markdown(png, "reward and accuracy"), ""]
    lines += _saved(image_path, png)
    before, after = heldout
    if before is not None or after is not None:
        lines += [
            f"held-out accuracy: {fmt_value(before)} before, {fmt_value(after)} after training",
            "",
        ]
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
        key=key or default_key("timeline"),
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
        "\n".join(lines), key=key or default_key("curve"), description="reward/accuracy curve"
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
    measured = safely("timeline", reports.last_step_records, timeline or []) or []
    md = results_markdown(summary, history, measured=measured, predicted=predicted, out_dir=out)
    before, after = summary.get("heldout_acc_before"), summary.get("heldout_acc_after")
    publish_markdown(
        md,
        key=default_key("summary"),
        description=f"{summary.get('steps', len(history))} steps; held-out accuracy "
        f"{fmt_value(before)} -> {fmt_value(after)}; curve and timeline inside",
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
