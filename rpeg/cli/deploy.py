"""``rpeg deploy`` and ``rpeg server start|worker|env|status``: Prefect deployments and infra.

``rpeg deploy my-run.yaml [--flow train|retrain] [--cron "0 3 * * *" --timezone Europe/Zurich
| --interval 3600]`` registers a deployment of the job (flow ``train`` or ``retrain``) named
after the config (``train/my-run``), whose form defaults are the config's values. By default
it *serves* it (this process is the runner; runs happen on this machine; Ctrl-C stops it and
pauses the deployment), honouring the concurrency limit of the job's ``prefect.yaml`` entry
(``--concurrency`` overrides it). With ``--work-pool POOL`` it registers the deployment on a
process work pool and returns; ``rpeg server worker --pool POOL`` executes the runs.
``--dry-run`` prints the deployment and touches no API. ``rpeg server status`` tells which
deployments a runner or worker serves right now.

Secrets never come from arguments: the basic-auth ``user:password`` is read from
``$PREFECT_SERVER_API_AUTH_STRING`` / ``$PREFECT_API_AUTH_STRING`` or ``--auth-file`` (mode 600)
and printed masked.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rpeg.cli import json_out

server_app = typer.Typer(
    name="server",
    help="Prefect infrastructure: a server on loopback, a process worker, client settings.",
    no_args_is_help=True,
)


def deploy(
    config: str = typer.Argument(
        ..., help="run YAML (path or fsspec URL); the form's defaults come from it"
    ),
    flow: str = typer.Option("train", "--flow", help="the job: train or retrain"),
    name: str | None = typer.Option(
        None, "--name", help="deployment name (default: the config file's name)"
    ),
    cron: str | None = typer.Option(None, "--cron", help='cron schedule, e.g. "0 3 * * *"'),
    interval: float | None = typer.Option(None, "--interval", help="schedule every N seconds"),
    timezone: str = typer.Option(
        "UTC", "--timezone", help="time zone of the schedule (IANA name, e.g. Europe/Zurich)"
    ),
    param: list[str] = typer.Option(
        None, "--param", "-p", help="default parameter NAME=VALUE (YAML value), repeatable"
    ),
    work_pool: str | None = typer.Option(
        None,
        "--work-pool",
        help="register on this process work pool and return (run `rpeg server worker`)",
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        help="at most N runs of this deployment at once (default: prefect.yaml's limit)",
    ),
    limit: int | None = typer.Option(None, "--limit", help="serve: at most N concurrent runs"),
    poll: int | None = typer.Option(
        None, "--poll", help="serve: runner poll interval in seconds (Prefect default 10)"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="validate and print the deployment; no API calls"
    ),
) -> None:
    """Register a Prefect deployment of the training or retraining job."""
    from rpeg.flows import deployments as dp

    spec = dp.build_spec(
        config,
        job=flow,
        name=name,
        cron=cron,
        interval=interval,
        timezone=timezone,
        params=param,
        work_pool=work_pool,
        concurrency_limit=concurrency,
    )
    if dry_run:
        typer.echo(json_out.dumps(spec, indent=1))
        return
    from rpeg.infra.cluster import prefect_env

    prefect_env()
    full = f"{flow}/{spec['name']}"
    if spec["work_pool"]:
        dep_id = dp.deploy_to_pool(spec)
        typer.echo(f"deployment {full} registered on work pool {work_pool!r}: {dep_id}")
        typer.echo(f"run it: prefect deployment run '{full}' --param steps=...")
        return
    lim = spec["concurrency_limit"]
    typer.echo(
        f"serving deployment {full} (concurrency limit {lim or 'none'}; Ctrl-C stops and pauses it)"
    )
    dp.serve_specs([spec], limit=limit, poll_s=poll)


def _term_as_interrupt() -> None:
    """SIGTERM (and SIGINT, even when a background shell ignored it) stop the command
    like Ctrl-C, so it ends the server/worker process group it started."""
    import signal

    def _raise(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)


_AUTH_HELP = (
    "require basic auth; the user:password is read from $PREFECT_SERVER_API_AUTH_STRING "
    "(or --auth-file), never from the command line"
)


@server_app.command(
    "start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def server_start(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="listen address (loopback unless --expose)"
    ),
    port: int = typer.Option(4200, "--port"),
    home: str | None = typer.Option(
        None, "--home", help="PREFECT_HOME (SQLite database there); default ~/.prefect"
    ),
    auth: bool = typer.Option(False, "--auth", help=_AUTH_HELP),
    auth_file: str | None = typer.Option(
        None, "--auth-file", help="file whose first line is user:password (chmod 600)"
    ),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        envvar="PREFECT_API_DATABASE_CONNECTION_URL",
        show_envvar=False,
        help="e.g. postgresql+asyncpg://prefect:PW@db:5432/prefect; better in "
        "$PREFECT_API_DATABASE_CONNECTION_URL (it holds a password)",
    ),
    expose: bool = typer.Option(
        False, "--expose", help="allow a non-loopback --host (needs --auth or --auth-file)"
    ),
    no_services: bool = typer.Option(
        False, "--no-services", help="no scheduler etc. (schedules will not fire)"
    ),
) -> None:
    """Run a Prefect server in the foreground until Ctrl-C; prints the client settings."""
    import time

    from rpeg.errors import ConfigError, Problem
    from rpeg.infra.prefect_server import AUTH_ENV, PrefectServer, export_lines, read_auth

    if ctx.args:  # e.g. the old `--auth user:password`: refuse without echoing it
        raise ConfigError(
            [
                Problem(
                    "arguments",
                    f"{len(ctx.args)} unexpected argument(s) (not shown: a password does not "
                    f"belong on the command line); put user:password in {AUTH_ENV} or "
                    "--auth-file and pass --auth",
                )
            ],
            title="refused",
        )
    secret = read_auth(auth_file) if (auth or auth_file) else None
    if auth and not secret:
        raise ConfigError(
            [Problem("--auth", f"set {AUTH_ENV}=user:password in the environment or --auth-file")],
            title="no basic-auth string",
        )
    srv = PrefectServer(
        host=host,
        port=port,
        home=home,
        auth_string=secret,
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
        + export_lines(
            srv.client_env(base={}),
            ["PREFECT_API_URL", "PREFECT_API_AUTH_STRING"],
            auth_file=auth_file,
        )
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
    auth_file: str | None = typer.Option(
        None,
        "--auth-file",
        help="file whose first line is user:password (default: $PREFECT_API_AUTH_STRING)",
    ),
    limit: int | None = typer.Option(None, "--limit", help="at most N concurrent flow runs"),
) -> None:
    """Run a process worker for ``pool`` in the foreground (Ctrl-C stops it)."""
    from rpeg.infra.prefect_server import CLIENT_AUTH_ENV, read_auth, start_worker, stop_process

    secret = read_auth(auth_file, env_var=CLIENT_AUTH_ENV)
    _term_as_interrupt()
    proc = start_worker(pool, api=api, auth_string=secret, limit=limit, log_path=None)
    try:
        raise typer.Exit(proc.wait())
    except KeyboardInterrupt:
        stop_process(proc)


@server_app.command("env")
def server_env_cmd(
    api: str = typer.Option(
        "http://127.0.0.1:4200/api", "--api-url", help="Prefect API URL (remote or local)"
    ),
    auth_file: str | None = typer.Option(
        None, "--auth-file", help="file whose first line is user:password (read by the shell)"
    ),
    dask: str | None = typer.Option(
        None, "--dask", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786"
    ),
) -> None:
    """Print shell exports that point clients at a Prefect API (and a Dask scheduler)."""
    from rpeg.infra.prefect_server import client_env, export_lines, read_auth

    secret = read_auth(auth_file, env_var="PREFECT_API_AUTH_STRING") if auth_file else None
    env = client_env(api, auth_string=secret, base={})
    keys = [
        "DO_NOT_TRACK",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        "PREFECT_API_URL",
        "PREFECT_API_AUTH_STRING",
    ]
    typer.echo(export_lines(env, keys, auth_file=auth_file))
    if dask:
        typer.echo(
            f"# Dask: rpeg deploy CONFIG --param cluster_address={dask}  (or cluster.address in"
            " the config, or the 'Dask scheduler address' field of the run form)"
        )


@server_app.command("status")
def server_status(
    api: str | None = typer.Option(
        None, "--api-url", envvar="PREFECT_API_URL", help="Prefect API URL"
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON rows"),
) -> None:
    """Deployments and whether a runner or worker serves them now (polled < 60 s ago)."""
    from rpeg.flows.deployments import status_rows

    rows = status_rows(api)
    if as_json:
        typer.echo(json_out.dumps(rows, indent=1))
        return
    if not rows:
        typer.echo("no deployments")
        return
    cols = ["deployment", "served", "schedules", "concurrency_limit", "work_pool"]
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    typer.echo("  ".join(c.ljust(width[c]) for c in cols))
    for r in rows:
        typer.echo("  ".join(str(r[c]).ljust(width[c]) for c in cols))


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    app.add_typer(server_app, name="server")
