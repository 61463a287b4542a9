"""A lifeline: the services a command started die with it, even on ``kill -9``.

``rpeg train`` starts Prefect's ephemeral API server (a uvicorn subprocess), Dask worker
processes and verifier processes. Dask's workers notice a dead parent and exit; Prefect's
server did not: after ``kill -9`` of ``rpeg train`` it kept running. :func:`start_lifeline`
starts one small watcher process (``python -m rpeg.infra.lifeline``) that holds the read end
of a pipe whose write end only the command holds. While the command lives the watcher
records the command's descendants once a second; when the pipe reports end-of-file (the
command exited, however it died) it sends SIGTERM to every recorded descendant that still
exists (same pid *and* start time, so a reused pid is never hit), SIGKILL after a grace
period, and exits.

Decisions: a watcher process instead of process groups (``killpg`` would hit whatever
shares the group when rpeg is not its leader, e.g. a test runner), and instead of
``PR_SET_PDEATHSIG`` (it must be set inside each child, and Prefect spawns its server
itself). Processes started less than one polling interval before the command died may be
missed; the ones that matter (servers, workers) live for the whole run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

_STARTED: subprocess.Popen | None = None
_LOCK = threading.Lock()


def start_lifeline(
    poll_s: float = 1.0, grace_s: float = 3.0, ready_timeout_s: float = 15.0
) -> int | None:
    """Start the watcher for this process (once per process) and wait until it watches
    (at most ``ready_timeout_s``); return its pid (None if psutil is missing)."""
    global _STARTED
    try:
        import psutil  # noqa: F401 - the watcher needs it (a distributed dependency)
    except ImportError:  # pragma: no cover
        return None
    with _LOCK:
        if _STARTED is not None and _STARTED.poll() is None:
            return _STARTED.pid
        r, w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        _STARTED = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rpeg.infra.lifeline",
                str(os.getpid()),
                str(poll_s),
                str(grace_s),
            ],
            stdin=r,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,  # Ctrl-C in a terminal reaches the command, not this
        )
        os.close(r)
        # wait (bounded) until the watcher has taken its first look at our children
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(_STARTED.stdout, selectors.EVENT_READ)
            if sel.select(timeout=ready_timeout_s):
                _STARTED.stdout.read(1)
        _STARTED.stdout.close()
        # the write end stays open (unused, not inheritable) for this process's lifetime
        _STARTED._rpeg_pipe_w = w  # type: ignore[attr-defined]
        return _STARTED.pid


def _watch(parent: int, poll_s: float, grace_s: float) -> None:  # pragma: no cover - child
    import selectors

    import psutil

    me = os.getpid()
    seen: dict[int, float] = {}  # pid -> create_time
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
    ready = False
    while True:
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(parent).children(recursive=True):
                if c.pid != me:
                    with contextlib.suppress(psutil.Error):
                        seen[c.pid] = c.create_time()
        if not ready:  # tell the parent it is watched now
            ready = True
            with contextlib.suppress(OSError):
                os.write(sys.stdout.fileno(), b"R")
                os.close(sys.stdout.fileno())
        if sel.select(timeout=poll_s) and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the parent is gone
    victims = []
    for pid, t in seen.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == t:
                victims.append(p)
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(victims, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


if __name__ == "__main__":  # pragma: no cover
    _watch(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
