"""One compute thread per process: a rank's torch intra-op threads on the thread that runs its
work, every other thread of the process at one.

torch's CPU wheel parallelises ops with OpenMP (libgomp), which keeps a team of worker threads
for *each* thread that opens a parallel region. Once a process's libgomp threads outnumber
the cores it may run on, libgomp throttles every team: a worker that finds no work spins 100
times instead of 300,000 and then sleeps (the GCC libgomp manual, ``GOMP_SPINCOUNT``), so
each parallel region pays a futex wake-up per thread. A Dask worker runs a rank's methods on
its actor thread, builds the rank (the actor's constructor) on a task thread, and
serializes tensors on its event-loop thread; at
``runtime.torch_threads=2`` on 2 cores, any second thread that ran one parallel op made a
second team, and from then on the rank's elementwise ops took 6-7x longer (a 64 x 1024 GELU
45 -> 310 us) and the built-in task's step on one worker at 2 threads 689 ms against 434 ms for
the single process at 2 threads (docs/measurements.md 2026-12-06). One process, one team:

* :func:`single_threaded` -- this thread runs torch at one thread, and so does every thread
  that first runs torch later; a Dask worker calls it at start (its preload,
  :func:`rpeg.runtime.actors.serializers.dask_setup`), before its event loop touches a tensor.
* :func:`claim` -- the thread that runs the process's torch work gets ``n`` threads; the
  process default stays one (``torch.set_num_threads`` sets the calling thread's OpenMP
  count and a process-wide default that other threads take when they first run torch: the
  default is put back to one from a short-lived thread, which leaves this thread's count).
  :func:`rpeg.runtime.role_builder.build_roles` claims ``runtime.torch_threads``.
* :func:`on_rank_thread` -- run a callable on the Dask worker's actor thread (where the rank's
  methods run) and wait: the rank is built on the thread that will run it, so the build's
  parallel ops use the team its steps use.

At one thread per process (the default, ``runtime.torch_threads=1``) no team is made at all
and nothing here changes a step.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_STATE = threading.local()  # .threads: what this thread claimed


def single_threaded() -> None:
    """This thread, and every thread that first runs torch after this call, at one intra-op
    thread (until :func:`claim` gives one thread more)."""
    import torch

    torch.get_num_threads()  # this thread's lazy OpenMP set-up first: it reads the default
    torch.set_num_threads(1)
    _STATE.threads = 1


def claim(n: int) -> None:
    """This thread runs torch at ``n`` intra-op threads; threads that first run torch later
    take one (the process default), so only this thread ever opens an ``n``-thread team."""
    import torch

    if n < 1:
        raise ValueError(f"runtime.torch_threads={n}: must be >= 1")
    torch.get_num_threads()  # lazy set-up of this thread before its count is set
    torch.set_num_threads(n)
    if n > 1:
        # the process default back to one, from a thread of its own: this thread keeps n
        reset = threading.Thread(target=torch.set_num_threads, args=(1,), name="rpeg-threads")
        reset.start()
        reset.join()
    _STATE.threads = n


def claimed() -> int | None:
    """The intra-op threads this thread claimed (None: it never called :func:`claim` or
    :func:`single_threaded`)."""
    return getattr(_STATE, "threads", None)


def on_rank_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on the Dask worker's actor thread, waited for (its exception raised here),
    in the caller's context (``distributed.get_worker()`` works there); inline outside a Dask
    worker or on that thread itself. Called from a task thread (an actor's constructor): the
    actor thread runs one call at a time, so a call from inside one of its own methods that
    this module did not start would wait for itself -- the rank never does that."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not in a Dask worker's task
        return fn()
    pool = getattr(worker, "executors", {}).get("actor")
    if pool is None or getattr(_STATE, "actor_thread", False):
        return fn()

    def marked() -> T:
        _STATE.actor_thread = True  # a nested call on this thread runs inline
        return fn()

    # the caller's context goes along: distributed.get_worker() answers there too
    return pool.submit(contextvars.copy_context().run, marked).result()


def wait_policy_env(processes: int, threads: int, cores: int, environ: dict | None = None) -> dict:
    """``{"OMP_WAIT_POLICY": "PASSIVE"}`` for the worker processes of one host when their
    torch threads outnumber its cores (``processes x threads > cores``, threads > 1), else
    ``{}``; a policy already in ``environ`` (default: this process's) is left to the user.

    With one team per process (above) libgomp spins its idle threads 300,000 times before
    sleeping -- right while the process has its cores, a core burnt per waiting thread when
    another process needs it. Measured on 2 cores, the built-in task on 2 workers x 2 torch
    threads: 2,082 ms a step spinning, 605-637 ms passive (1 worker x 2 threads: 443-455 ms;
    docs/measurements.md 2026-12-06)."""
    import os

    env = os.environ if environ is None else environ
    if threads > 1 and processes * threads > cores and "OMP_WAIT_POLICY" not in env:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    return {}
