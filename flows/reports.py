"""What the run artifacts show: markdown and pictures (PNG bytes), no Prefect.

* :func:`image_markdown` -- a PNG embedded as a ``data:`` URI (the Prefect UI renders it in
  a markdown artifact; it serves no local files, so a path alone shows nothing).
* :func:`curve_png` -- reward and accuracy over the steps of a run.
* :func:`gantt_png` -- the measured and predicted stage timeline of one step
  (:func:`rpeg.perf.timeline.gantt`), measured and predicted rows side by side.
* :func:`plan_report` -- the execution plan as markdown, its predicted stage timeline, and
  a picture of the step's graph (Graphviz ``dot`` when installed).

Pictures are drawn small (about 30-60 KB) so an artifact stays light in the database.
"""

from __future__ import annotations

import base64
import io
import logging
import math
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("rpeg.flows.reports")

CURVE_METRICS = (("reward_mean", "reward (mean)"), ("accuracy", "accuracy (sampled)"))


def image_markdown(png: bytes, alt: str) -> str:
    """``![alt](data:image/png;base64,...)``."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    _pyplot().close(fig)
    return buf.getvalue()


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v))


def curve_png(
    history: Sequence[Mapping[str, Any]],
    *,
    heldout: tuple[float | None, float | None] = (None, None),
    title: str = "",
) -> bytes | None:
    """Reward and accuracy per step (steps count from 1); the held-out accuracy before and
    after training as two markers. None without any step."""
    if not history:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.4))
    steps = [int(h.get("step", i + 1)) for i, h in enumerate(history)]
    drawn = 0
    for key, label in CURVE_METRICS:
        pts = [(s, h[key]) for s, h in zip(steps, history, strict=True) if _finite(h.get(key))]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=label)
            drawn += 1
    before, after = heldout
    if _finite(before):
        ax.scatter([0], [before], marker="s", color="black", zorder=3, label="held-out before")
    if _finite(after):
        ax.scatter(
            [steps[-1]], [after], marker="*", s=90, color="black", zorder=3, label="held-out after"
        )
    if not drawn and not _finite(before) and not _finite(after):
        plt.close(fig)
        return None
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "reward and accuracy per step", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _records(items: Iterable[Any] | None) -> list[Any]:
    from rpeg.perf.timeline import TimelineRecord

    out = []
    for r in items or []:
        out.append(r if isinstance(r, TimelineRecord) else TimelineRecord.from_dict(dict(r)))
    return out


def last_step_records(records: Iterable[Any]) -> list[Any]:
    """The measured records of the newest step, shifted to start at 0 s."""
    recs = _records(records)
    if not recs:
        return []
    last = max(r.step for r in recs)
    recs = [r for r in recs if r.step == last]
    t0 = min(r.start_s for r in recs)
    from dataclasses import replace

    return [replace(r, start_s=r.start_s - t0, end_s=r.end_s - t0, source="measured") for r in recs]


def gantt_png(
    measured: Iterable[Any] | None, predicted: Iterable[Any] | None = None, *, title: str = ""
) -> bytes | None:
    """The step's Gantt chart, one row per (source, device group). None without records."""
    from dataclasses import replace

    from rpeg.perf.timeline import gantt

    meas, pred = _records(measured), _records(predicted)
    both = [
        replace(r, device_group=f"{src} {r.device_group}")
        for src, rs in (("predicted", pred), ("measured", meas))
        for r in rs
    ]
    if not both:
        return None
    with tempfile.TemporaryDirectory(prefix="rpeg-gantt-") as d:
        path = Path(d) / "gantt.png"
        gantt(both, str(path), title=title or "one step: predicted vs measured")
        return path.read_bytes()


def stage_seconds_markdown(label: str, records: Iterable[Any]) -> list[str]:
    by: dict[str, float] = {}
    for r in _records(records):
        by[r.stage] = by.get(r.stage, 0.0) + r.duration_s
    if not by:
        return []
    lines = [f"### {label}", "", "| stage | seconds |", "| --- | --- |"]
    lines += [f"| {s} | {t:.4g} |" for s, t in sorted(by.items(), key=lambda kv: -kv[1])]
    return [*lines, ""]


def graph_png(graph: Any) -> bytes | None:
    """The step graph drawn by Graphviz (None when ``dot`` is missing or fails)."""
    from rpeg.ir.visual import dot_to_image, has_graphviz, to_dot

    if not has_graphviz():
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="rpeg-graph-") as d:
            path = dot_to_image(to_dot(graph), Path(d) / "graph.png", "png")
            return path.read_bytes()
    except Exception as exc:  # noqa: BLE001 - a picture is never worth a failed run
        log.warning("could not draw the graph: %s", exc)
        return None


def plan_report(config: Any) -> tuple[str, list[Any]]:
    """(markdown, predicted timeline records) of the config's plan: the graph picture, the
    predicted step time and stage times, the plan YAML. Best effort: a failure is shown in
    the markdown, never raised."""
    try:
        from rpeg.compile.sources import resolve
        from rpeg.perf.pricing import predict

        graph, plan = resolve(None, config)
    except Exception as exc:  # noqa: BLE001
        return f"# Execution plan\n\nnot available: {type(exc).__name__}: {exc}\n", []
    lines = ["# Execution plan", ""]
    png = graph_png(graph)
    if png is not None:
        lines += [image_markdown(png, "the RL step as a graph"), ""]
    else:
        lines += ["(no graph picture: the Graphviz `dot` binary is not installed)", ""]
    predicted: list[Any] = []
    try:
        from rpeg.specs.hf import priced_model

        # the run's model (model.path's config.json, else model.name), not the plan's default
        pred = predict(graph, plan, config.workload, model=priced_model(config.model))
        predicted = list(pred.timeline)
        lines += [
            f"predicted step: **{pred.step_s:.3g} s** on {pred.num_devices} device(s), "
            f"{pred.tokens_per_s_per_gpu:.3g} tokens/s per device, MFU {pred.mfu:.2%}",
            "",
            *stage_seconds_markdown("predicted stage times", predicted),
        ]
    except Exception as exc:  # noqa: BLE001
        lines += [f"(no prediction: {type(exc).__name__}: {exc})", ""]
    lines += ["### plan", "", "```yaml", plan.to_yaml().rstrip(), "```", ""]
    return "\n".join(lines), predicted


__all__ = [
    "curve_png",
    "gantt_png",
    "graph_png",
    "image_markdown",
    "last_step_records",
    "plan_report",
    "stage_seconds_markdown",
]
