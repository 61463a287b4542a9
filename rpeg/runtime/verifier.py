"""The verifier pool: rewards that need a main thread (or may hang) run in child processes.

math-verify bounds its parsing and comparison with ``signal.alarm``, which only works on a
process's main thread; Dask runs actor methods on threads, so there it raised on every
sample and the run trained on zeros. :class:`VerifierPool` keeps a few long-lived child
processes (``python -m rpeg.runtime.verifier_child``), each running rewards on its main thread,
and enforces a wall-clock limit per sample from the parent.

Decisions:

* Plain subprocesses with a JSON-lines protocol on stdin/stdout, not ``multiprocessing``:
  a spawned multiprocessing child re-imports the parent's ``__main__`` (a user's training
  script without an ``if __name__ == "__main__"`` guard would start again in every child),
  a forked one can deadlock on the parent's torch/Dask/Prefect threads, and results come
  back as JSON, never as pickles. The child resolves a reward by its registered name (after
  importing the module that defines it), so only code the parent registered can run.
* One request per sample, handed to whichever child is free (a queue, not fixed shares), so a
  slow or hanging sample holds one child while the others go on. When every busy child has been
  on its sample for :data:`SLOW_S` and samples wait, the pool doubles its busy children, up to
  :data:`MAX_PROCESSES`, and keeps that many busy for the rest of the batch (a timed-out child's
  replacement takes the next sample): ``k`` hanging samples cost about ``ceil(k / MAX_PROCESSES)`` times the
  limit (64 hanging samples at the 30 s default: ~4 min, where fixed shares over two children
  took 16, one after another). When a
  child gives no result for ``timeout_s`` its sample is scored as a timeout and the child is
  killed; fresh ones take the queue. The clock starts once the child reports the reward
  resolved (a child's start-up and imports get :data:`STARTUP_S`). Per sample this costs a JSON
  encode/decode and a pipe round trip (tens of microseconds).
* Children beyond the pool's base size are stopped when the batch is scored; the base ones are
  reused. A child exits when its stdin closes, so it does not outlive the process that owns it.
* A reward calling ``sys.exit`` is an error sample like an exception (``SystemExit: 3``), in
  the child and inline alike; it does not end the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

Outcome = tuple[float | None, str]  # (value, "") or (None, "ErrorType: message")
#: in the error of a reward the child cannot build (its module does not register it on import)
NOT_REGISTERED = "is not registered in the verifier process"
#: a child's start-up and the import of a request's reward are not held to the per-sample
#: limit (a loaded machine can take seconds); they get this long
STARTUP_S = 120.0
#: a sample running this long (or half the limit, if shorter) counts as slow: when every busy
#: child is on a slow sample and samples wait, the pool starts more children
SLOW_S = 1.0
#: the most children one pool runs at once (each a Python process with the reward imported:
#: ~30-150 MB); bounds both the memory and the wall time of hanging samples
MAX_PROCESSES = 8


def call_reward(fn: Callable[..., Any], prompt: str, response: str, ref: str) -> Outcome:
    """Run one reward; an exception (or ``sys.exit``) becomes an error text (the caller counts
    it)."""
    try:
        return float(fn(prompt, response, ref)), ""
    except SystemExit as exc:  # a reward must not end the process that scores it
        return None, f"SystemExit: the reward called sys.exit({exc.code!r})"
    except Exception as exc:  # noqa: BLE001 - reported as a reward error by the caller
        return None, f"{type(exc).__name__}: {exc}"


def _spec(name: str, fn: Callable[..., Any], modules: Sequence[str]) -> dict[str, Any]:
    return {
        "name": name,
        "module": getattr(fn, "__module__", "") or "",
        "modules": list(modules),
        "path": [p for p in sys.path if p],  # a reused child started before a change to it
    }


class _Child:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rpeg.runtime.verifier_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buf = b""
        self.index: int | None = None  # the sample sent, without a result yet
        self.sent = 0.0
        self.ready: float | None = None  # when the child reported this request's reward resolved

    def send(self, spec: dict[str, Any], item: tuple[str, str, str], index: int) -> None:
        self.index, self.sent, self.ready = index, time.monotonic(), None
        line = json.dumps({"fn": spec, "item": list(item)}) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()

    def read_lines(self) -> list[str]:
        with contextlib.suppress(BlockingIOError):
            while True:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [x.decode() for x in lines]

    def stuck(self, now: float, slow_s: float) -> bool:
        return self.ready is not None and now - self.ready > slow_s

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                f.close()


class VerifierPool:
    """Reused child processes that run rewards on their main thread (see module doc):
    ``processes`` kept between batches, up to ``max_processes`` while samples are slow."""

    def __init__(self, processes: int | None = None, max_processes: int = MAX_PROCESSES):
        self.processes = processes or max(1, min(2, os.cpu_count() or 1))
        self.max_processes = max(self.processes, max_processes)
        self._children: list[_Child] = []  # idle, reused by the next batch
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for c in self._children:
                c.kill()
            self._children = []

    def map(
        self,
        name: str,
        fn: Callable[..., Any],
        items: Sequence[tuple[str, str, str]],
        timeout_s: float,
        modules: Sequence[str] = (),
    ) -> list[Outcome]:
        """Score ``items`` with the reward ``name`` (``fn``, registered under that name; the
        child imports ``fn``'s module and ``modules`` first); one outcome per item, in order."""
        spec = _spec(name, fn, modules)
        n = len(items)
        out: dict[int, Outcome] = {}
        slow_s = min(SLOW_S, timeout_s / 2)
        with self._lock:
            idle = [c for c in self._children if c.alive()]
            for c in self._children:
                if c not in idle:
                    c.kill()
            self._children = []
            busy: list[_Child] = []
            width = self.processes  # children busy at once; grows while samples are slow
            pending = list(range(n - 1, -1, -1))  # popped from the end: sample 0 first
            sel = selectors.DefaultSelector()

            def start(c: _Child) -> None:
                if not c.alive():  # it died after its last result
                    c.kill()
                    c = _Child()
                try:
                    c.send(spec, items[pending[-1]], pending[-1])
                except OSError:  # died between the check and the write: a fresh one
                    c.kill()
                    c = _Child()
                    c.send(spec, items[pending[-1]], pending[-1])
                pending.pop()
                sel.register(c.proc.stdout, selectors.EVENT_READ, c)
                busy.append(c)

            try:
                while pending or busy:
                    while pending and (idle or len(busy) < width):
                        start(idle.pop() if idle else _Child())
                    now = time.monotonic()
                    if pending and busy and all(c.stuck(now, slow_s) for c in busy):
                        width = min(self.max_processes, 2 * len(busy))  # kept after timeouts
                        while pending and len(busy) < width:
                            start(_Child())
                    sel.select(timeout=min(0.1, slow_s))
                    now = time.monotonic()
                    for c in list(busy):
                        self._collect(c, now, out)
                        if c.index is not None:
                            dead = not c.alive()
                            limit = timeout_s if c.ready else max(timeout_s, STARTUP_S)
                            if not dead and now - (c.ready or c.sent) <= limit:
                                continue
                            what = (
                                "the verifier process died"
                                if dead
                                else f"no result within {timeout_s:g} s (wall clock)"
                            )
                            out[c.index] = (None, f"TimeoutError: {what}")
                            c.kill()
                        else:
                            idle.append(c)
                        sel.unregister(c.proc.stdout)
                        busy.remove(c)
            finally:
                sel.close()
                for c in busy + idle[self.processes :]:
                    c.kill()
                self._children = idle[: self.processes]
        return [out[i] for i in range(n)]

    @staticmethod
    def _collect(c: _Child, now: float, out: dict[int, Outcome]) -> None:
        for line in c.read_lines():
            msg = json.loads(line)
            if isinstance(msg, dict):  # {"ready": true}: the reward is resolved
                c.ready = now
            elif c.index is not None:
                v, err = msg
                out[c.index] = (None if v is None else float(v), err)
                c.index = None


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def verifier_pool() -> VerifierPool:
    """The process-wide verifier pool (children start on first use and are reused)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool()
        return _POOL
