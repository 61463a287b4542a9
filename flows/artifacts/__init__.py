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
``log_step(step, total_steps, metrics) -> None``  (the step's log line only)
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

What each module holds: ``context`` (run context, keys, logger), ``steps`` (per step: log
line, progress bar, metrics and samples tables), ``pages`` (markdown pages: checkpoint, plan
report, refused run, summary numbers), ``results`` (a finished run's page with its pictures).
"""

from rpeg.flows.artifacts.context import (
    artifact_key,
    flow_run_id,
    in_prefect_run,
    run_logger,
)
from rpeg.flows.artifacts.pages import (
    location_text,
    publish_checkpoint,
    publish_markdown,
    publish_plan_report,
    publish_refused,
    publish_summary,
    summary_markdown,
)
from rpeg.flows.artifacts.results import (
    curve_section,
    publish_curve,
    publish_results,
    publish_timeline,
    results_markdown,
    timeline_section,
)
from rpeg.flows.artifacts.steps import (
    MAIN_METRICS,
    TABLE_METRICS,
    format_step_line,
    log_step,
    progress_artifact_id,
    publish_metrics_table,
    publish_samples,
    publish_step,
)

__all__ = [
    "MAIN_METRICS",
    "TABLE_METRICS",
    "flow_run_id",
    "run_logger",
    "artifact_key",
    "curve_section",
    "format_step_line",
    "in_prefect_run",
    "location_text",
    "progress_artifact_id",
    "publish_checkpoint",
    "publish_curve",
    "publish_markdown",
    "publish_metrics_table",
    "publish_plan_report",
    "publish_refused",
    "publish_results",
    "log_step",
    "publish_samples",
    "publish_step",
    "publish_summary",
    "publish_timeline",
    "results_markdown",
    "summary_markdown",
    "timeline_section",
]
