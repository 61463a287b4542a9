"""``rpeg deploy`` and ``rpeg server start|worker|env``: Prefect deployments and infra.

``rpeg deploy my-run.yaml [--flow train|retrain] [--cron "0 3 * * *" | --interval 3600]``
registers a deployment whose default parameters point at the config (absolute path or
URL). By default it *serves* it (``flow.serve``: this process is the runner, runs happen on
this machine, Ctrl-C stops it and pauses the deployment). With ``--work-pool POOL`` it
registers the deployment on a process work pool and returns; a ``rpeg server worker --pool
POOL`` (on any machine with this repository) executes the runs. ``--dry-run`` prints the
deployment and touches no API.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import typer

FLOWS = {
    # --flow value: (entrypoint relative to the repository root, module, attribute, params model)
    "train": ("flows/retrain.py:rpeg_train", "rpeg.flows.retrain", "rpeg_train", "TrainParams"),
    "retrain": ("flows/retrain.py:retrain", "rpeg.flows.retrain", "retrain", "RetrainParams"),
}
DEFAULT_NAMES = {"train": "rl-train", "retrain": "retrain"}
REPO_ROOT = Path(__file__).resolve().parents[2]

server_app = typer.Typer(
    name="server",
    help="Prefect infrastructure: a server on loopback, a process worker, client settings.",
    no_args_is_help=True,
)


def _abs_config(config: str) -> str:
    if "://" in config:
        return config
    p = Path(config).expanduser()
    if not p.is_file():
        from rpeg.errors import ConfigError, Problem

        raise ConfigError([Problem(config, "config file not found")])
    return str(p.resolve())


def build_deployment_spec(
    config: str,
    *,
    flow: str = "train",
    name: str | None = None,
    cron: str | None = None,
    interval: float | None = None,
    params: list[str] | None = None,
    work_pool: str | None = None,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """Validate everything a deployment needs and return its spec (no Prefect API calls).

    The parameters are validated with the flow's pydantic model and the config is loaded
    with the overrides applied, so a bad value fails here rather than in a scheduled run.
    """
    from rpeg.errors import ConfigError, Problem
    from rpeg.flows import params as pm

    problems = []
    if flow not in FLOWS:
        problems.append(Problem("--flow", f"got {flow!r}; allowed: {sorted(FLOWS)}"))
    if cron and interval:
        problems.append(Problem("--cron/--interval", "give one schedule, not both"))
    if interval is not None and interval <= 0:
        problems.append(Problem("--interval", f"must be > 0 seconds (got {interval})"))
    if cron:
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=cron)
        except ValueError:
            problems.append(Problem("--cron", f"{cron!r} is not a valid cron expression"))
    if problems:
        raise ConfigError(problems, title="invalid deployment")
    entrypoint, _, _, model_name = FLOWS[flow]
    model = getattr(pm, model_name)
    values = {"config": _abs_config(config), **pm.parse_param_assignments(params)}
    from pydantic import ValidationError

    from rpeg.config import problems_from_pydantic

    try:
        p = model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(
            [Problem(f"--param {x.where}", x.what) for x in problems_from_pydantic(exc)],
            title="invalid deployment",
        ) from None
    p.resolve()  # the config and its overrides validate now
    return {
        "name": name or DEFAULT_NAMES[flow],
        "flow": flow,
        "entrypoint": entrypoint,
        "parameters": {
            "params": p.model_dump(mode="json", exclude_defaults=True) | {"config": p.config}
        },
        "cron": cron,
        "interval": interval,
        "work_pool": work_pool,
        "tags": ["rpeg", flow, *(tags or [])],
        "source": str(REPO_ROOT),
    }


def load_flow(flow: str):
    import importlib

    _, module, attr, _ = FLOWS[flow]
    return getattr(importlib.import_module(module), attr)


def ensure_work_pool(name: str, pool_type: str = "process") -> None:
    """Create the work pool if it does not exist (``flow.deploy`` refuses a missing pool)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name=name, type=pool_type))


def deploy_spec(
    spec: dict[str, Any], *, limit: int | None = None, poll_s: int | None = None
) -> Any:
    """Serve the deployment (blocks) or register it on a work pool (returns its id)."""
    import os

    from rpeg.infra.cluster import prefect_env

    prefect_env()
    if poll_s:
        os.environ["PREFECT_RUNNER_POLL_FREQUENCY"] = str(poll_s)
    sched: dict[str, Any] = {}
    if spec["cron"]:
        sched["cron"] = spec["cron"]
    if spec["interval"]:
        sched["interval"] = spec["interval"]
    if spec["work_pool"]:
        from prefect import Flow

        ensure_work_pool(spec["work_pool"])
        f = Flow.from_source(source=spec["source"], entrypoint=spec["entrypoint"])
        return f.deploy(
            name=spec["name"],
            work_pool_name=spec["work_pool"],
            parameters=spec["parameters"],
            tags=spec["tags"],
            build=False,
            push=False,
            print_next_steps=False,
            **sched,
        )
    f = load_flow(spec["flow"])
    f.serve(
        name=spec["name"],
        parameters=spec["parameters"],
        tags=spec["tags"],
        limit=limit,
        enforce_parameter_schema=True,
        **sched,
    )
    return None


def deploy(
    config: str = typer.Argument(
        ..., help="run YAML (path or fsspec URL); becomes the default `config` parameter"
    ),
    flow: str = typer.Option(
        "train", "--flow", help="train (rpeg-train: rl_train with a typed form) or retrain"
    ),
    name: str | None = typer.Option(
        None, "--name", help="deployment name (default rl-train / retrain)"
    ),
    cron: str | None = typer.Option(None, "--cron", help='cron schedule, e.g. "0 3 * * *"'),
    interval: float | None = typer.Option(None, "--interval", help="schedule every N seconds"),
    param: list[str] = typer.Option(
        None, "--param", "-p", help="default parameter NAME=VALUE (YAML value), repeatable"
    ),
    work_pool: str | None = typer.Option(
        None,
        "--work-pool",
        help="register on this process work pool and return (run `rpeg server worker`)",
    ),
    limit: int | None = typer.Option(None, "--limit", help="serve: at most N concurrent runs"),
    poll: int | None = typer.Option(
        None, "--poll", help="serve: runner poll interval in seconds (Prefect default 10)"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="validate and print the deployment; no API calls"
    ),
) -> None:
    """Register a Prefect deployment of the training or retraining flow."""
    spec = build_deployment_spec(
        config,
        flow=flow,
        name=name,
        cron=cron,
        interval=interval,
        params=param,
        work_pool=work_pool,
    )
    if dry_run:
        typer.echo(json.dumps(spec, indent=1))
        return
    if spec["work_pool"]:
        dep_id = deploy_spec(spec)
        typer.echo(
            f"deployment {FLOWS[flow][2]}/{spec['name']} registered on work pool {work_pool!r}: {dep_id}"
        )
        typer.echo(f"run it: prefect deployment run '{load_flow(flow).name}/{spec['name']}'")
        return
    typer.echo(
        f"serving {spec['flow']} as deployment {spec['name']!r} (Ctrl-C stops and pauses it)"
    )
    deploy_spec(spec, limit=limit, poll_s=poll)


def _term_as_interrupt() -> None:
    """SIGTERM (and SIGINT, even when a background shell ignored it) stop the command
    like Ctrl-C, so it ends the server/worker process group it started."""
    import signal

    def _raise(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)


@server_app.command("start")
def server_start(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="listen address (loopback unless --expose)"
    ),
    port: int = typer.Option(4200, "--port"),
    home: str | None = typer.Option(
        None, "--home", help="PREFECT_HOME (SQLite database there); default ~/.prefect"
    ),
    auth: str | None = typer.Option(
        None,
        "--auth",
        envvar="PREFECT_SERVER_API_AUTH_STRING",
        help="basic-auth 'user:password' for API and UI",
    ),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        help="e.g. postgresql+asyncpg://prefect:pw@db:5432/prefect (shared servers)",
    ),
    expose: bool = typer.Option(False, "--expose", help="allow a non-loopback --host"),
    no_services: bool = typer.Option(
        False, "--no-services", help="no scheduler etc. (schedules will not fire)"
    ),
) -> None:
    """Run a Prefect server in the foreground until Ctrl-C; prints the client settings."""
    import time

    from rpeg.infra.prefect_server import PrefectServer, export_lines

    srv = PrefectServer(
        host=host,
        port=port,
        home=home,
        auth_string=auth,
        database_url=database_url,
        expose=expose,
        services=not no_services,
    )
    srv.log_path = Path(home or Path.home() / ".prefect") / "prefect-server.log"
    _term_as_interrupt()
    srv.start()
    typer.echo(f"Prefect server up in {srv.start_s:.1f}s: UI {srv.ui_url}  (log {srv.log_path})")
    typer.echo(
        "clients:\n"
        + export_lines(srv.client_env(base={}), ["PREFECT_API_URL", "PREFECT_API_AUTH_STRING"])
    )
    try:
        while srv.proc is not None and srv.proc.poll() is None:
            time.sleep(1.0)
        typer.echo(srv.log_tail(), err=True)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


@server_app.command("worker")
def server_worker(
    pool: str = typer.Option("rpeg", "--pool", help="process work pool (created if missing)"),
    api: str | None = typer.Option(
        None, "--api-url", envvar="PREFECT_API_URL", help="Prefect API URL"
    ),
    auth: str | None = typer.Option(
        None, "--auth", envvar="PREFECT_API_AUTH_STRING", help="basic-auth 'user:password'"
    ),
    limit: int | None = typer.Option(None, "--limit", help="at most N concurrent flow runs"),
) -> None:
    """Run a process worker for ``pool`` in the foreground (Ctrl-C stops it)."""
    from rpeg.infra.prefect_server import start_worker, stop_process

    _term_as_interrupt()
    proc = start_worker(pool, api=api, auth_string=auth, limit=limit, log_path=None)
    try:
        raise typer.Exit(proc.wait())
    except KeyboardInterrupt:
        stop_process(proc)


@server_app.command("env")
def server_env_cmd(
    api: str = typer.Option(
        "http://127.0.0.1:4200/api", "--api-url", help="Prefect API URL (remote or local)"
    ),
    auth: str | None = typer.Option(None, "--auth", help="basic-auth 'user:password'"),
    dask: str | None = typer.Option(
        None, "--dask", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786"
    ),
) -> None:
    """Print shell exports that point clients at a Prefect API (and a Dask scheduler)."""
    from rpeg.infra.prefect_server import client_env, export_lines

    env = client_env(api, auth_string=auth, base={})
    keys = [
        "DO_NOT_TRACK",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        "PREFECT_API_URL",
        "PREFECT_API_AUTH_STRING",
    ]
    typer.echo(export_lines(env, keys))
    if dask:
        typer.echo(
            f"# Dask: rpeg deploy CONFIG --param cluster_address={dask}  (or cluster.address in the config,"
            " or the 'Dask scheduler' field of the run form)"
        )


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    app.add_typer(server_app, name="server")
