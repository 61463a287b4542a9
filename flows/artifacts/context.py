"""Where an artifact goes and how values read: the Prefect run context (flow run id, flow
name), artifact keys, the run logger, never-failing calls and number formatting."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

log = logging.getLogger("rpeg.flows.artifacts")


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


def flow_run_id() -> str:
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


def default_key(kind: str) -> str:
    return artifact_key(_flow_name(), kind)


def run_logger() -> Any:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run
        return log


def safely(what: str, fn, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - artifacts never fail a run
        log.warning("could not publish %s artifact: %s: %s", what, type(exc).__name__, exc)
        return None


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)
