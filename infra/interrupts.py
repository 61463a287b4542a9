"""Ctrl-C stops a run, not its services first.

A terminal's Ctrl-C sends SIGINT to every process of the foreground process group: the
command, and also the services it started -- Prefect's ephemeral API server (uvicorn), the
Dask worker processes, the lifeline watcher. They used to die first, each printing its own
``KeyboardInterrupt`` traceback; the flow's crash report then found no API to write to and
retried it for ~80 s before ``rpeg train`` ended with ``error: ConnectError: Connection
refused`` (exit 1). Measured on ``rpeg train configs/builtin.yaml --steps 40``, SIGINT to its
process group at step 15.

* :func:`services_ignore_sigint` -- while inside, this process ignores SIGINT, so a child
  started then inherits "ignored" (POSIX keeps an ignored signal ignored across ``exec``,
  and Python leaves an inherited SIG_IGN in place). The command's own handler comes back on
  exit. Only the command then takes Ctrl-C; it closes its services in order (the flow
  records its crash on a live API, the cluster closes its workers) and exits 130.
* :func:`start_ephemeral_api` -- starts Prefect's ephemeral API server now, in a session of
  its own (Prefect would otherwise start it lazily at the first API call, in the command's
  process group). Inheriting "ignored" is not enough there: uvicorn installs its own SIGINT
  handler. A no-op when ``PREFECT_API_URL`` points at a server.

Decisions: Dask's workers are shielded rather than put in sessions of their own because Dask
spawns them with no way to pass ``start_new_session``; Prefect's server start is given one by
handing its module a ``subprocess`` whose ``Popen`` adds it (the only change to how Prefect
starts it; if a Prefect release moves that call, the server starts as before and only the
Ctrl-C behaviour is lost). A child that ignores SIGINT, or has its own session, still stops
on SIGTERM, which is what the cluster's close, Prefect's ``atexit`` stop and the lifeline
(which finds descendants by parent, whatever their session) send.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

_LOCK = threading.Lock()
_DEPTH = 0
_SAVED = None


@contextlib.contextmanager
def services_ignore_sigint() -> Iterator[None]:
    """Children started inside ignore SIGINT (the terminal's Ctrl-C); this process takes it
    again on exit. Nestable; a no-op off the main thread (only it may set handlers)."""
    global _DEPTH, _SAVED
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _LOCK:
        if _DEPTH == 0:
            _SAVED = signal.signal(signal.SIGINT, signal.SIG_IGN)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                signal.signal(signal.SIGINT, _SAVED)
                _SAVED = None


def start_ephemeral_api(log=None) -> bool:
    """Start Prefect's ephemeral API server now, in a session of its own (the terminal's
    Ctrl-C does not reach it), waiting on its ``/health`` up to :func:`_startup_timeout_s`
    (a loaded machine's start-up fits); True if this call started it (False: an API URL is
    set, ephemeral mode is off, or it already runs). ``log``: told when the wait begins, every
    :data:`PROGRESS_EVERY_S` while it lasts, and how long it took."""
    try:
        import prefect.server.api.server as server_module
        from prefect.settings import PREFECT_API_URL
    except ImportError:  # another Prefect layout: it starts its own server as before
        return False
    if PREFECT_API_URL.value() or not _ephemeral_allowed():
        return False
    server = server_module.SubprocessASGIServer()
    if getattr(server, "running", False):
        return False
    real = getattr(server_module, "subprocess", None)
    if real is not None:
        server_module.subprocess = _OwnSession(real)
    timeout = _startup_timeout_s()
    shown = timeout or os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
    done = threading.Event()
    t0 = time.monotonic()
    if log is not None:
        log(f"starting Prefect's API server (waiting up to {shown} s for its health check)")

        def tick() -> None:
            while not done.wait(PROGRESS_EVERY_S):
                log(f"  ... Prefect's API server still starting ({time.monotonic() - t0:.0f} s)")

        threading.Thread(target=tick, daemon=True, name="rpeg-api-wait").start()
    try:
        server.start(timeout=timeout)
    finally:
        done.set()
        if real is not None:
            server_module.subprocess = real
    if log is not None:
        log(f"Prefect's API server ready ({time.monotonic() - t0:.1f} s)")
    return True


#: how often the wait for the API server is reported (seconds)
PROGRESS_EVERY_S = 10.0


#: seconds the ephemeral API may take to start when the user has not set Prefect's own
#: PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (its default, 20 s, is shorter than a first
#: start: a new database's migrations took 31.6 s on the 2-core machine, prefect 3.9.1)
EPHEMERAL_STARTUP_TIMEOUT_S = 120


def _startup_timeout_s() -> int | None:
    """The user's Prefect setting when given (None: Prefect reads it), else ours."""
    if os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):
        return None
    return EPHEMERAL_STARTUP_TIMEOUT_S


def _ephemeral_allowed() -> bool:
    """Prefect's ``server.ephemeral.enabled`` (a user who turned it off gets Prefect's own
    "no API URL" error, not a server started for them)."""
    try:
        from prefect.settings import PREFECT_SERVER_ALLOW_EPHEMERAL_MODE
    except ImportError:
        return True
    return bool(PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value())


class _OwnSession:
    """The ``subprocess`` module, except that ``Popen`` starts its process in a new session."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    def Popen(self, *args, **kwargs):  # noqa: N802 - the module's name
        kwargs.setdefault("start_new_session", True)
        return self._module.Popen(*args, **kwargs)
