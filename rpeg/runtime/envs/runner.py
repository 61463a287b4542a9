"""Environment calls with a wall-clock limit and bounded concurrency.

:meth:`EnvRunner.run_all` runs one environment call per sample, at most ``concurrency`` at
a time, each on a daemon thread given ``timeout_s`` from its start (waiting for a free slot
counts against the same limit). A call that raises, returns something that is not an
:class:`~rpeg.runtime.envs.base.EnvStep` with a text observation, or does not return in
time becomes an :class:`EnvOutcome` with an error reason; nothing raises out and nothing
waits past the limit. A hung call keeps its thread and its slot until it returns (Python
cannot stop a thread); when every slot is held by hung calls, later calls time out too --
counted, never a stalled step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rpeg.runtime.envs.base import BadToolResult, EnvStep
from rpeg.runtime.envs.tool_sandbox import ToolTimeout

#: error reasons of environment calls (the rollout adds its caps: turn_cap, sample_cap)
ENV_TIMEOUT, ENV_ERROR, ENV_BAD_RESULT = "env_timeout", "env_error", "env_bad_result"


@dataclass(frozen=True)
class EnvOutcome:
    """One call's result: ``step``, or ``error`` (a reason) with ``detail``."""

    step: EnvStep | None = None
    error: str = ""
    detail: str = ""


class _Call:
    def __init__(self, fn: Callable[[], EnvStep], slots: threading.Semaphore):
        self.fn, self.slots = fn, slots
        self.done = threading.Event()
        self.outcome = EnvOutcome(error=ENV_TIMEOUT, detail="no result")
        self.deadline = 0.0

    def run(self) -> None:
        try:
            got = self.fn()
            if not isinstance(got, EnvStep) or not isinstance(got.observation, str):
                self.outcome = EnvOutcome(
                    error=ENV_BAD_RESULT, detail=f"returned {type(got).__name__}"
                )
            else:
                self.outcome = EnvOutcome(step=got)
        except ToolTimeout as exc:  # the tool's process was killed at its limit
            self.outcome = EnvOutcome(error=ENV_TIMEOUT, detail=str(exc)[:200])
        except BadToolResult as exc:
            self.outcome = EnvOutcome(error=ENV_BAD_RESULT, detail=str(exc)[:200])
        except Exception as exc:  # noqa: BLE001 - any failure is this sample's, counted
            self.outcome = EnvOutcome(error=ENV_ERROR, detail=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            self.slots.release()
            self.done.set()


class EnvRunner:
    """Runs environment calls with ``timeout_s`` each and at most ``concurrency`` at once."""

    def __init__(self, timeout_s: float, concurrency: int):
        if timeout_s <= 0 or concurrency < 1:
            raise ValueError("timeout_s must be > 0 and concurrency >= 1")
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self._slots = threading.Semaphore(concurrency)

    def run_all(self, fns: Sequence[Callable[[], EnvStep]]) -> list[EnvOutcome]:
        calls: list[_Call | None] = []
        for fn in fns:
            start = time.monotonic()
            if not self._slots.acquire(timeout=self.timeout_s):
                calls.append(None)  # every slot held past the limit: a timeout, counted
                continue
            c = _Call(fn, self._slots)
            c.deadline = start + self.timeout_s
            threading.Thread(target=c.run, daemon=True, name="rpeg-env").start()
            calls.append(c)
        out = []
        for c in calls:
            if c is None:
                out.append(EnvOutcome(error=ENV_TIMEOUT, detail="no free slot in time"))
            elif c.done.wait(max(0.0, c.deadline - time.monotonic())):
                out.append(c.outcome)
            else:
                out.append(EnvOutcome(error=ENV_TIMEOUT, detail=f"over {self.timeout_s} s"))
        return out
