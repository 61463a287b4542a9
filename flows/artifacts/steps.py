"""Per-step artifacts: the step's log line, the run's progress bar (created once per flow run
and key, then updated), the per-step metrics table and a logged step's samples."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from rpeg.flows.api_calls import api_call
from rpeg.flows.artifacts.context import (
    default_key,
    flow_run_id,
    fmt_value,
    in_prefect_run,
    run_logger,
)

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


# ---------------------------------------------------------------------- per step
def format_step_line(step: int, total_steps: int, metrics: Mapping[str, Any]) -> str:
    """``step 3/20 reward_mean=0.41 accuracy=0.38 ... step_s=0.62``."""
    keys = [k for k in MAIN_METRICS if k in metrics]
    keys += sorted(
        k
        for k in metrics
        if k not in MAIN_METRICS and k != "step" and isinstance(metrics[k], int | float)
    )
    body = " ".join(f"{k}={fmt_value(metrics[k])}" for k in keys[:16])
    return f"step {step}/{total_steps} {body}".rstrip()


def log_step(step: int, total_steps: int, metrics: Mapping[str, Any] | None = None) -> None:
    """Only the step's line in the flow run's log (what :func:`publish_step` logs), no
    artifact call: for the steps between two progress updates."""
    if in_prefect_run():
        run_logger().info(format_step_line(step, total_steps, metrics or {}))


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
        run_logger().info(format_step_line(step, total_steps, metrics))
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    pct = 100.0 * min(max(step, 0), max(total_steps, 1)) / max(total_steps, 1)
    k = key or default_key("progress")
    rid = flow_run_id()
    desc = f"step {step}/{total_steps}"
    if "reward_mean" in metrics:
        desc += f", reward {fmt_value(metrics['reward_mean'])}"
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
    return _PROGRESS.get((flow_run_id(), key or default_key("progress")))


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
        key=key or default_key("metrics"),
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
        key=key or default_key("samples"),
        description=f"samples of step {step} (all logged samples: samples.jsonl)",
    )
