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
* One request per child per batch (its contiguous share of the samples), one result line
  per sample: the per-sample cost is a JSON encode/decode (tens of microseconds). When a
  child gives no result for ``timeout_s`` the sample it is on is scored as a timeout, the
  child is killed and a fresh one takes the rest of its share. The clock starts once the
  child reports the reward imported (start-up and imports get :data:`STARTUP_S`).
* A child exits when its stdin closes, so it does not outlive the process that owns it.
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
#: a child's start-up and the import of a request's reward are not held to the per-sample
#: limit (a loaded machine can take seconds); they get this long
STARTUP_S = 120.0


def call_reward(fn: Callable[..., Any], prompt: str, response: str, ref: str) -> Outcome:
    """Run one reward; an exception becomes an error text (the caller counts it)."""
    try:
        return float(fn(prompt, response, ref)), ""
    except Exception as exc:  # noqa: BLE001 - reported as a reward error by the caller
        return None, f"{type(exc).__name__}: {exc}"


def _spec(name: str, fn: Callable[..., Any]) -> dict[str, str]:
    return {
        "name": name,
        "module": getattr(fn, "__module__", "") or "",
        "qualname": getattr(fn, "__qualname__", "") or "",
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
        self.todo: list[int] = []  # sample indices sent, in order, without a result yet
        self.last = time.monotonic()
        self.ready = False  # the child has imported this request's reward

    def send(self, spec: dict[str, str], items: list[tuple[str, str, str]], idx: list[int]):
        self.todo = list(idx)
        self.last = time.monotonic()
        self.ready = False
        line = json.dumps({"fn": spec, "items": items}) + "\n"
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
    """A few reused child processes that run rewards on their main thread (see module doc)."""

    def __init__(self, processes: int | None = None):
        self.processes = processes or max(1, min(2, os.cpu_count() or 1))
        self._children: list[_Child] = []
        self._lock = threading.Lock()

    def _child(self, i: int) -> _Child:
        while len(self._children) <= i:
            self._children.append(_Child())
        if not self._children[i].alive():
            self._children[i].kill()
            self._children[i] = _Child()
        return self._children[i]

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
    ) -> list[Outcome]:
        """Score ``items`` with the reward ``name`` (``fn``); one outcome per item, in order."""
        spec = _spec(name, fn)
        out: dict[int, Outcome] = {}
        n = len(items)
        if n == 0:
            return []
        with self._lock:
            k = min(self.processes, n)
            shares = [list(range(n))[j * n // k : (j + 1) * n // k] for j in range(k)]
            active: dict[int, _Child] = {}
            for j, idx in enumerate(shares):
                if idx:
                    c = self._child(j)
                    c.send(spec, [items[i] for i in idx], idx)
                    active[j] = c
            sel = selectors.DefaultSelector()
            for j, c in active.items():
                sel.register(c.proc.stdout, selectors.EVENT_READ, j)
            try:
                while active:
                    sel.select(timeout=min(0.5, timeout_s))
                    now = time.monotonic()
                    for j, c in list(active.items()):
                        for line in c.read_lines():
                            msg = json.loads(line)
                            c.last = now
                            if isinstance(msg, dict):  # {"ready": true}: reward imported
                                c.ready = True
                                continue
                            v, err = msg
                            out[c.todo.pop(0)] = (None if v is None else float(v), err)
                        if not c.todo:
                            sel.unregister(c.proc.stdout)
                            del active[j]
                            continue
                        dead = not c.alive()
                        limit = timeout_s if c.ready else max(timeout_s, STARTUP_S)
                        if dead or now - c.last > limit:
                            what = (
                                "the verifier process died"
                                if dead
                                else f"no result within {timeout_s:g} s (wall clock)"
                            )
                            out[c.todo.pop(0)] = (None, f"TimeoutError: {what}")
                            sel.unregister(c.proc.stdout)
                            c.kill()
                            rest = c.todo
                            del active[j]
                            if rest:
                                self._children[j] = c = _Child()
                                c.send(spec, [items[i] for i in rest], rest)
                                active[j] = c
                                sel.register(c.proc.stdout, selectors.EVENT_READ, j)
            finally:
                sel.close()
        return [out[i] for i in range(n)]


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def verifier_pool() -> VerifierPool:
    """The process-wide verifier pool (children start on first use and are reused)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool()
        return _POOL
