"""Tools run in child processes that can be stopped: killed at the timeout, with memory and
CPU limits (issue 44).

A tool call on a thread cannot be stopped: a calculator expression whose exact value grows
to millions of digits held the GIL for 31 s, so the heartbeat thread and the environment's
timeout froze with it, and the thread burned CPU after the rollout gave up. Here the
environment thread only waits on a pipe (the GIL is free) and the work happens in
``python -m rpeg.runtime.envs.tool_child``:

* The child imports only :mod:`rpeg.runtime.envs.tools` (no torch) and resolves a tool by
  its registered name in :data:`~rpeg.runtime.envs.tools.TOOLS`: only registered tools run
  there, nothing the parent sends is code. A tool given to a :class:`ToolEnv` through its own
  registry (not ``TOOLS``) runs inline, under the rollout's thread timeout only.
* Its address space is limited to its size after the imports plus :data:`TOOL_MEMORY_BYTES`
  (``RLIMIT_AS``; a larger allocation is a ``MemoryError``, returned as the tool's error) and
  each call's CPU time to the call's timeout plus one second (``RLIMIT_CPU``, re-armed per
  call: the kernel's SIGXCPU ends a child the parent did not).
* The parent waits for the answer until the timeout and then SIGKILLs the child
  (:class:`ToolTimeout`, an ``env_timeout`` sample); a fresh child takes the next call. Idle
  children are kept for reuse (at most :data:`MAX_IDLE`); a child exits when its stdin closes,
  so none outlives the process that started it.

JSON lines on stdin/stdout, as the verifier pool's children (:mod:`rpeg.runtime.verifier`):
results come back as text, never as pickles. A call costs a pipe round trip (~0.1 ms).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

#: a child's address space may grow this much beyond its size after start-up
TOOL_MEMORY_BYTES = 256 * 2**20
#: a tool call's limit when the caller gives none (seconds; the rollout passes
#: ``task.multiturn.env_timeout_s``)
TOOL_TIMEOUT_S = 10.0
#: a child's start-up (the interpreter and the tool module) is not held to a call's limit on
#: a loaded machine; it gets this long
STARTUP_S = 60.0
#: idle children kept for the next calls
MAX_IDLE = 8
#: the longest answer line read back from a child (characters)
MAX_ANSWER_CHARS = 1 << 20


class ToolTimeout(TimeoutError):
    """The tool gave no answer within its limit; its process was killed."""


class ToolFailed(RuntimeError):
    """The tool's process ended without an answer (a memory or CPU limit, a crash)."""


def child_argv() -> list[str]:
    """The command of a tool process."""
    return [sys.executable, "-m", "rpeg.runtime.envs.tool_child", str(TOOL_MEMORY_BYTES)]


class _Child:
    def __init__(self, argv: list[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self.ready = False

    def read_line(self, deadline: float) -> str | None:
        """One line from the child by ``deadline`` (None: none came in time)."""
        out = self.proc.stdout
        fd = out.fileno()
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise ToolFailed(f"the tool process ended (exit {self.proc.wait(timeout=5)})")
            buf += chunk
            if len(buf) > MAX_ANSWER_CHARS:
                raise ToolFailed(f"the tool's answer is over {MAX_ANSWER_CHARS} bytes")
        return buf.decode()

    def call(self, name: str, argument: str, timeout_s: float) -> dict[str, Any]:
        if not self.ready:
            if self.read_line(time.monotonic() + STARTUP_S) is None:
                raise ToolFailed(f"the tool process did not start within {STARTUP_S:.0f} s")
            self.ready = True
        req = {"tool": name, "argument": argument, "cpu_s": int(timeout_s) + 1}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        line = self.read_line(time.monotonic() + timeout_s)
        if line is None:
            raise ToolTimeout(f"tool {name!r} gave no result within {timeout_s:g} s (killed)")
        return json.loads(line)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                f.close()


class ToolPool:
    """Child processes for tool calls: one per call in flight, idle ones reused (``argv``:
    the child's command, :func:`child_argv` by default)."""

    def __init__(self, argv: list[str] | None = None) -> None:
        self.argv = argv or child_argv()
        self._idle: list[_Child] = []
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Start a child now if none is idle (its start-up overlaps the model's turn)."""
        with self._lock:
            if not self._idle:
                self._idle.append(_Child(self.argv))

    def call(self, name: str, argument: str, timeout_s: float) -> dict[str, Any]:
        """``{"result": text}``, ``{"refused": why}`` (the tool refused the argument) or
        ``{"error": "Type: message"}``; :class:`ToolTimeout` / :class:`ToolFailed` when the
        child gave no answer (it is killed)."""
        with self._lock:
            child = self._idle.pop() if self._idle else None
        child = child or _Child(self.argv)
        try:
            answer = child.call(name, argument, timeout_s)
        except BaseException:
            child.kill()
            raise
        with self._lock:
            if len(self._idle) < MAX_IDLE and child.proc.poll() is None:
                self._idle.append(child)
                child = None
        if child is not None:
            child.kill()
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.kill()


_POOL: ToolPool | None = None
_POOL_LOCK = threading.Lock()


def tool_pool() -> ToolPool:
    """This process's pool (closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ToolPool()
            atexit.register(_POOL.close)
        return _POOL
