"""Bring up the Prefect side of RPEG: a server on loopback, a process worker, client
settings for a remote API. Used by ``rpeg server ...`` and by the tests.

* :class:`PrefectServer` -- ``prefect server start`` in a subprocess with its own
  ``PREFECT_HOME`` (SQLite there) or a PostgreSQL URL, on ``127.0.0.1`` by default; waits
  for ``/api/health``; ``stop()`` ends only the process it started.
* :func:`server_env` / :func:`client_env` -- the environment for a server / a client
  (telemetry off, API URL, basic-auth string).
* :func:`start_worker` -- ``prefect worker start --pool NAME --type process``.
* :func:`wait_flow_run` -- poll a flow run until it is final.

Nothing listens on a non-loopback address unless ``expose=True`` is passed explicitly, and
an exposed server needs an auth string. Basic auth: the server takes
``PREFECT_SERVER_API_AUTH_STRING="user:pass"``, every client (flows, workers, ``serve``,
the CLI) ``PREFECT_API_AUTH_STRING`` with the same value; the UI asks for it. The secret
reaches the server through its environment only (never its command line), and is read by
:func:`read_auth` from an environment variable or a file, never from an argument; printed
settings show ``user:***`` (:func:`mask_auth`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpeg.errors import ConfigError, Problem

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_host(host: str, expose: bool, auth_string: str | None = None) -> None:
    """Loopback, or ``expose`` *and* basic auth: nothing answers strangers without a password."""
    if not is_loopback(host) and not expose:
        raise ConfigError(
            [
                Problem(
                    "host",
                    f"{host!r} is not a loopback address; pass expose=True (--expose) to listen on it",
                )
            ],
            title="refusing to listen on a non-loopback address",
        )
    if not is_loopback(host) and not auth_string:
        raise ConfigError(
            [
                Problem(
                    "auth",
                    f"listening on {host!r} needs basic auth: set {AUTH_ENV} (user:password) or "
                    "pass --auth-file FILE",
                )
            ],
            title="refusing to expose a server without auth",
        )


AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH_ENV = "PREFECT_API_AUTH_STRING"


def _check_auth(value: str, source: str) -> str:
    user, sep, pw = value.partition(":")
    if not sep or not user or not pw:
        raise ConfigError(
            [Problem(source, "expected user:password (the value is not shown)")],
            title="invalid basic-auth string",
        )
    return value


def read_auth(auth_file: str | Path | None = None, env_var: str = AUTH_ENV) -> str | None:
    """The ``user:password`` string from ``auth_file`` (first line), else from ``env_var``,
    else None. Errors name the source, never the value; a file others can read is refused."""
    if auth_file:
        p = Path(auth_file).expanduser()
        try:
            mode = p.stat().st_mode
            text = p.read_text().splitlines()[0].strip() if p.read_text().strip() else ""
        except OSError as exc:
            raise ConfigError(
                [Problem(str(auth_file), f"cannot read the auth file: {exc.strerror}")],
                title="invalid basic-auth string",
            ) from None
        if mode & 0o077:
            raise ConfigError(
                [
                    Problem(
                        str(auth_file),
                        f"readable by group/others (mode {mode & 0o777:o}); chmod 600 it",
                    )
                ],
                title="invalid basic-auth string",
            )
        return _check_auth(text, str(auth_file))
    value = os.environ.get(env_var)
    return _check_auth(value, f"${env_var}") if value else None


def mask_auth(auth_string: str | None) -> str | None:
    """``user:***`` (what may be printed)."""
    if not auth_string:
        return None
    return auth_string.partition(":")[0] + ":***"


def api_url(host: str, port: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"http://{h}:{port}/api"


def server_env(
    *,
    host: str = "127.0.0.1",
    port: int = 4200,
    home: str | Path | None = None,
    auth_string: str | None = None,
    database_url: str | None = None,
    base: dict[str, str] | None = None,
    ui: bool = True,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for ``prefect server start`` (and for clients on the same machine)."""
    env = dict(os.environ if base is None else base)
    env.update(QUIET_ENV)
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    env["PREFECT_SERVER_API_HOST"] = host
    env["PREFECT_SERVER_API_PORT"] = str(port)
    env["PREFECT_API_URL"] = api_url(host, port)
    env["PREFECT_UI_API_URL"] = api_url(host, port)
    env["PREFECT_UI_ENABLED"] = "true" if ui else "false"
    if auth_string:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth_string
        env["PREFECT_API_AUTH_STRING"] = auth_string
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    env.update(extra or {})
    return env


def client_env(
    api: str, *, auth_string: str | None = None, base: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for a client (flow, worker, ``serve``) of the API at ``api``."""
    env = dict(os.environ if base is None else base)
    env.update(QUIET_ENV)
    env["PREFECT_API_URL"] = api.rstrip("/")
    if auth_string:
        env["PREFECT_API_AUTH_STRING"] = auth_string
    return env


def export_lines(
    env: dict[str, str], keys: list[str] | None = None, *, auth_file: str | Path | None = None
) -> str:
    """Shell exports of ``keys``; an auth string is never printed: it is read back from
    ``auth_file`` (``"$(cat FILE)"``) or from the variable the user set."""
    import shlex

    keys = keys or [k for k in env if k.startswith("PREFECT_") or k == "DO_NOT_TRACK"]
    lines = []
    for k in keys:
        if k not in env:
            continue
        if k in (AUTH_ENV, CLIENT_AUTH_ENV):
            ref = (
                f'"$(head -n1 {shlex.quote(str(auth_file))})"'
                if auth_file
                else f'"${{{AUTH_ENV}:-${CLIENT_AUTH_ENV}}}"'
            )
            lines.append(f"export {k}={ref}  # {mask_auth(env[k])}")
        else:
            lines.append(f"export {k}={shlex.quote(env[k])}")
    return "\n".join(lines)


def _prefect_cmd() -> list[str]:
    exe = shutil.which(
        "prefect", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    )
    return [exe] if exe else [sys.executable, "-m", "prefect"]


def health(api: str, *, auth_string: str | None = None, timeout: float = 2.0) -> bool:
    req = urllib.request.Request(api.rstrip("/") + "/health")
    if auth_string:
        import base64

        req.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class PrefectServer:
    """A ``prefect server start`` subprocess on ``host:port`` (port 0 = a free one)."""

    host: str = "127.0.0.1"
    port: int = 0
    home: str | Path | None = None
    auth_string: str | None = field(default=None, repr=False)
    database_url: str | None = field(default=None, repr=False)
    expose: bool = False
    services: bool = True
    ui: bool = True
    log_path: str | Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = field(default=None, repr=False)
    start_s: float = 0.0

    def __post_init__(self) -> None:
        check_host(self.host, self.expose, self.auth_string)
        if not self.port:
            self.port = free_port(self.host)

    @property
    def api_url(self) -> str:
        return api_url(self.host, self.port)

    @property
    def ui_url(self) -> str:
        return self.api_url[: -len("/api")]

    def env(self) -> dict[str, str]:
        return server_env(
            host=self.host,
            port=self.port,
            home=self.home,
            auth_string=self.auth_string,
            database_url=self.database_url,
            ui=self.ui,
            extra=self.extra_env,
        )

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = client_env(self.api_url, auth_string=self.auth_string, base=base)
        if self.home is not None:
            env["PREFECT_HOME"] = str(self.home)
        return env

    def command(self) -> list[str]:
        cmd = [*_prefect_cmd(), "server", "start", "--host", self.host, "--port", str(self.port)]
        if not self.services:
            cmd.append("--no-services")
        if not self.ui:
            cmd.append("--no-ui")
        return cmd

    def start(self, timeout: float = 120.0) -> PrefectServer:
        """Start and wait until ``/api/health`` answers; raises RuntimeError with the log tail."""
        if self.home is not None:
            Path(self.home).mkdir(parents=True, exist_ok=True)
        log_path = Path(self.log_path or (Path(self.home or ".") / "prefect-server.log"))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.command(),
            env=self.env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() ends the server and its children
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prefect server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if health(self.api_url, auth_string=self.auth_string):
                self.start_s = time.perf_counter() - t0
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"prefect server not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except (OSError, TypeError):
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        with contextlib.suppress(Exception):
            self._log.close()
        self.proc = None

    def __enter__(self) -> PrefectServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_worker(
    pool: str,
    *,
    api: str | None = None,
    auth_string: str | None = None,
    limit: int | None = None,
    log_path: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """``prefect worker start --pool POOL --type process`` (creates the pool if missing)."""
    e = client_env(api, auth_string=auth_string, base=env) if api else dict(env or os.environ)
    e.update(QUIET_ENV)
    cmd = [*_prefect_cmd(), "worker", "start", "--pool", pool, "--type", "process"]
    if limit:
        cmd += ["--limit", str(limit)]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        cmd, env=e, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """End a process started with ``start_new_session=True`` (and its children)."""
    if proc.poll() is not None:
        return
    # SIGTERM, not SIGINT: a child of a background shell inherits an ignored SIGINT
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def wait_flow_run(flow_run_id: Any, *, timeout: float = 120.0, poll_s: float = 0.5) -> Any:
    """Poll the (configured) API until the flow run is final; returns the FlowRun."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            fr = client.read_flow_run(flow_run_id)
            if fr.state is not None and fr.state.type.value in FINAL_STATES:
                return fr
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"flow run {flow_run_id} still {fr.state and fr.state.name} after {timeout:.0f}s"
                )
            time.sleep(poll_s)


__all__ = [
    "PrefectServer",
    "api_url",
    "check_host",
    "client_env",
    "export_lines",
    "free_port",
    "health",
    "is_loopback",
    "mask_auth",
    "read_auth",
    "server_env",
    "start_worker",
    "stop_process",
    "wait_flow_run",
]
