"""Deployments of the two jobs (flows ``train`` and ``retrain``): their specs, schedules,
limits, and whether anything serves them. Used by ``rpeg deploy`` and ``rpeg server status``.

* :func:`build_spec` validates everything a deployment needs without touching the API:
  the parameters (every form field's default, filled from the config so the form shows
  what the config runs), the schedule (cron or interval, with a time zone), and the
  deployment's settings in ``prefect.yaml`` (description, tags, concurrency limit).
* :func:`to_runner_deployment` / :func:`serve_specs` serve specs with the concurrency limit
  honoured; :func:`deploy_to_pool` registers a spec on a process work pool.
* :func:`status_rows` says, per deployment, whether a runner or worker polled it recently
  ("served") or not ("NOT SERVED": runs will wait), next to Prefect's own status.

Runs started with only some parameters (``prefect deployment run train/tiny --param
steps=50``, or a REST body ``{"parameters": {"steps": 50}}``) keep the deployment's other
defaults: Prefect merges top-level parameters, and every form field is one.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rpeg.flows import params as pm

from rpeg.errors import ConfigError, Problem

REPO_ROOT = Path(__file__).resolve().parents[1]
PREFECT_YAML = REPO_ROOT / "prefect.yaml"
#: a runner polls every 10 s by default; a deployment not polled for this long is not served
SERVED_WITHIN_S = 60.0


@dataclass(frozen=True)
class Job:
    entrypoint: str  # relative to the repository root (prefect.yaml, work pools)
    module: str
    attr: str
    params: type


JOBS: dict[str, Job] = {
    "train": Job("flows/train_form.py:train", "rpeg.flows.train_form", "train", pm.TrainParams),
    "retrain": Job("flows/retrain.py:retrain", "rpeg.flows.retrain", "retrain", pm.RetrainParams),
}


def load_flow(job: str) -> Any:
    j = JOBS[job]
    return getattr(importlib.import_module(j.module), j.attr)


def _abs_config(config: str) -> str:
    if not config or "://" in config:
        return config
    p = Path(config).expanduser()
    if not p.is_file():
        raise ConfigError(
            [Problem("config", f"no such file: {config}")], title="invalid deployment"
        )
    return str(p.resolve())


def prefect_yaml_settings(job: str, path: Path = PREFECT_YAML) -> dict[str, Any]:
    """The first ``prefect.yaml`` deployment of ``job`` (same entrypoint), or {}."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError:
        return {}
    for d in doc.get("deployments") or []:
        if d.get("entrypoint") == JOBS[job].entrypoint:
            return d
    return {}


def check_timezone(tz: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            [Problem("--timezone", f"{tz!r} is not an IANA time zone (e.g. UTC, Europe/Zurich)")],
            title="invalid deployment",
        ) from None
    return tz


def build_spec(
    config: str,
    *,
    job: str = "train",
    name: str | None = None,
    cron: str | None = None,
    interval: float | None = None,
    timezone: str = "UTC",
    params: list[str] | None = None,
    work_pool: str | None = None,
    tags: list[str] | None = None,
    concurrency_limit: int | None = None,
) -> dict[str, Any]:
    """Validate a deployment and return its spec (plain data; no Prefect API calls).

    A bad value fails here (all problems at once), not in a scheduled run at 3 am."""
    problems = []
    if job not in JOBS:
        problems.append(Problem("--flow", f"got {job!r}; allowed: {sorted(JOBS)}"))
    if cron and interval:
        problems.append(Problem("--cron/--interval", "give one schedule, not both"))
    if interval is not None and interval <= 0:
        problems.append(Problem("--interval", f"must be > 0 seconds (got {interval})"))
    if concurrency_limit is not None and concurrency_limit < 1:
        problems.append(Problem("--concurrency", f"must be >= 1 (got {concurrency_limit})"))
    if cron:
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=cron)
        except ValueError:
            problems.append(Problem("--cron", f"{cron!r} is not a valid cron expression"))
    try:
        check_timezone(timezone)
    except ConfigError as exc:
        problems += exc.problems
    j = JOBS.get(job, JOBS["train"])
    values: dict[str, Any] = {}
    try:
        given = pm.parse_param_assignments(params)
        config_abs = _abs_config(given.pop("config", config))
        values = pm.form_defaults(j.params, config_abs, **given)
        # the config itself validates with these values applied
        j.params.model_validate(values).resolve()
    except ConfigError as exc:
        problems += [
            Problem(f"--param {p.where}".replace("--param config", "CONFIG"), p.what)
            for p in exc.problems
        ]
    if problems:
        raise ConfigError(problems, title="invalid deployment")
    from_yaml = prefect_yaml_settings(job)
    label = j.params.model_construct(config=config_abs).config_label()
    return {
        "name": name or label,
        "flow": job,
        "entrypoint": j.entrypoint,
        "parameters": values,
        "cron": cron,
        "interval": interval,
        "timezone": timezone,
        "work_pool": work_pool,
        "tags": list(dict.fromkeys(["rpeg", job, *(tags or [])])),
        "description": _description(job, config_abs),
        "concurrency_limit": concurrency_limit
        if concurrency_limit is not None
        else from_yaml.get("concurrency_limit"),
        "source": str(REPO_ROOT),
    }


def _description(job: str, config: str) -> str:
    what = {
        "train": "One training run",
        "retrain": "Retraining: newest data, resume, more steps, promote `latest-good`",
    }[job]
    return f"{what} with the config `{config or 'built-in'}`."


def schedules_of(spec: dict[str, Any]) -> list[Any]:
    from prefect.schedules import Cron, Interval

    tz = spec.get("timezone") or "UTC"
    if spec.get("cron"):
        return [Cron(spec["cron"], timezone=tz)]
    if spec.get("interval"):
        return [Interval(float(spec["interval"]), timezone=tz)]
    return []


def to_runner_deployment(spec: dict[str, Any]) -> Any:
    """The spec as a served deployment of the flow loaded in this process."""
    return load_flow(spec["flow"]).to_deployment(
        name=spec["name"],
        parameters=spec["parameters"],
        tags=spec["tags"],
        description=spec["description"],
        schedules=schedules_of(spec) or None,
        concurrency_limit=spec.get("concurrency_limit"),
        enforce_parameter_schema=True,
    )


def serve_specs(
    specs: list[dict[str, Any]], *, limit: int | None = None, poll_s: int | None = None
) -> None:
    """Serve the specs in this process until Ctrl-C (then they are paused)."""
    import os

    if poll_s:
        os.environ["PREFECT_RUNNER_POLL_FREQUENCY"] = str(poll_s)
    from prefect import serve

    serve(*(to_runner_deployment(s) for s in specs), limit=limit, print_starting_message=False)


def ensure_work_pool(name: str, pool_type: str = "process") -> None:
    """Create the work pool if it does not exist (``flow.deploy`` refuses a missing pool)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name=name, type=pool_type))


def deploy_to_pool(spec: dict[str, Any]) -> Any:
    """Register the spec on its process work pool; returns the deployment id."""
    from prefect import Flow

    ensure_work_pool(spec["work_pool"])
    f = Flow.from_source(source=spec["source"], entrypoint=spec["entrypoint"])
    return f.deploy(
        name=spec["name"],
        work_pool_name=spec["work_pool"],
        parameters=spec["parameters"],
        tags=spec["tags"],
        description=spec["description"],
        schedules=schedules_of(spec) or None,
        concurrency_limit=spec.get("concurrency_limit"),
        build=False,
        push=False,
        print_next_steps=False,
    )


# ---------------------------------------------------------------------- status
def _age_s(ts: Any, now: datetime) -> float | None:
    if ts is None:
        return None
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (now - ts).total_seconds()


def status_row(dep: dict[str, Any], flow_name: str, now: datetime | None = None) -> dict[str, Any]:
    """One deployment (the REST API's JSON) as a status row: served or not, and why."""
    now = now or datetime.now(UTC)
    age = _age_s(dep.get("last_polled"), now)
    if dep.get("paused"):
        served = "paused"
    elif age is None:
        served = "NOT SERVED (never polled)"
    elif age > SERVED_WITHIN_S:
        served = f"NOT SERVED (last poll {age:.0f} s ago)"
    else:
        served = f"served (last poll {age:.0f} s ago)"
    scheds = []
    for s in dep.get("schedules") or []:
        sch = s.get("schedule") or {}
        what = sch.get("cron") or (f"every {sch['interval']:g} s" if sch.get("interval") else "?")
        tz = sch.get("timezone") or "UTC"
        scheds.append(f"{what} {tz}" + ("" if s.get("active", True) else " (off)"))
    limit = dep.get("concurrency_limit")
    if limit is None and dep.get("global_concurrency_limit"):
        limit = dep["global_concurrency_limit"].get("limit")
    return {
        "deployment": f"{flow_name}/{dep.get('name')}",
        "served": served,
        "prefect_status": dep.get("status"),
        "work_pool": dep.get("work_pool_name") or "(served by a runner)",
        "schedules": ", ".join(scheds) or "none",
        "concurrency_limit": limit,
    }


def status_rows(api_url: str | None = None, auth_string: str | None = None) -> list[dict[str, Any]]:
    """Status rows of every deployment on the API (``PREFECT_API_URL`` by default)."""
    import base64
    import os

    import httpx

    url = (api_url or os.environ.get("PREFECT_API_URL") or "http://127.0.0.1:4200/api").rstrip("/")
    auth = auth_string or os.environ.get("PREFECT_API_AUTH_STRING")
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        deps = http.post("/deployments/filter", json={"limit": 200}).raise_for_status().json()
        flow_ids = sorted({d["flow_id"] for d in deps})
        flows = http.post(
            "/flows/filter", json={"flows": {"id": {"any_": flow_ids}}} if flow_ids else {}
        ).raise_for_status()
        names = {f["id"]: f["name"] for f in flows.json()}
    return [status_row(d, names.get(d["flow_id"], "?")) for d in deps]


__all__ = [
    "JOBS",
    "SERVED_WITHIN_S",
    "build_spec",
    "deploy_to_pool",
    "load_flow",
    "prefect_yaml_settings",
    "schedules_of",
    "serve_specs",
    "status_row",
    "status_rows",
    "to_runner_deployment",
]
