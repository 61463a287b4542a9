"""CPU core binding for CPU ranks: each worker process of a run on its own cores.

Ranks of one collective wait for each other at every all-reduce; when the OS scheduler puts
two ranks of a tensor-parallel pair on one core and leaves the other core to a rank of the
other pair, each exchange waits for a time slice. Binding worker slot ``i`` of ``n`` on a
host to its own block of the host's cores (``torchrun --numa-binding``, NeMo's ``numactl``
launchers, dask-cuda's per-GPU CPU affinity do the same for their processes) removes that:
measured on the 2-core CI machine, ``configs/sharded-cpu.yaml`` (4 ranks, tp=2 x fsdp dp=2)
ran 1.67-1.99 s per step bound against 2.11-2.46 s unbound, interleaved (docs/measurements.md;
docs/ranks.md "CPU core binding").

* :func:`core_block` -- pure: the cores of slot ``i`` of ``n`` over a host's cores: equal
  contiguous blocks when ``n <= cores``, else core ``i mod cores`` (more ranks than cores
  share them round-robin, so a tp pair lands on two different cores).
* :func:`should_bind` -- ``runtime.cpu_binding``: ``spread`` always, ``none`` never, ``auto``
  (the default) only where the run has more workers on the host than the host has cores:
  there binding is what keeps a tp pair on two cores; with a core or more per worker the OS
  places them as well (the built-in config, 2 workers on 2 cores: 0.74 s per step bound,
  0.71 s not), and two runs on one machine would bind their first workers to the same cores.
* :func:`bind_process` -- every thread of this process (the worker's event loop, the actor's
  thread, gloo's threads) on those cores.

:data:`HOST_CORES` is read when this module is first imported in a process, before any
binding, so a worker that a previous run bound still splits the host's whole set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

#: the cores this process could run on before any binding (Linux affinity; else all)
HOST_CORES: tuple[int, ...] = tuple(
    sorted(os.sched_getaffinity(0))
    if hasattr(os, "sched_getaffinity")
    else range(os.cpu_count() or 1)
)


def core_block(cores: Sequence[int], slot: int, n: int) -> list[int]:
    """The cores of worker ``slot`` (0-based) of ``n`` on a host with ``cores``."""
    if n < 1 or not 0 <= slot < n:
        raise ValueError(f"slot {slot} of {n}: need 0 <= slot < n")
    if not cores:
        raise ValueError("no cores to bind to")
    cores = list(cores)
    if n > len(cores):
        return [cores[slot % len(cores)]]
    size = len(cores) // n
    return cores[slot * size : (slot + 1) * size]


def should_bind(mode: str, workers_on_host: int, cores: int) -> bool:
    """Whether a worker binds itself (``mode``: ``runtime.cpu_binding``)."""
    if mode not in ("auto", "spread", "none"):
        raise ValueError(f"runtime.cpu_binding={mode!r}: allowed auto, spread, none")
    return mode == "spread" or (mode == "auto" and workers_on_host > cores)


def bind_process(cores: Sequence[int]) -> list[int]:
    """Bind every thread of this process to ``cores`` (threads it starts later inherit the
    binding of their creator); returns the cores, or [] where the OS has no affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    want = set(cores)
    tids = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), want)
    return sorted(want)


def worker_slots(hosts: Sequence[str]) -> list[tuple[int, int]]:
    """``(slot, workers on that host)`` of each worker, given each worker's host name in the
    run's worker order (the order fixes the slots)."""
    count: dict[str, int] = {}
    for h in hosts:
        count[h] = count.get(h, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for h in hosts:
        out.append((seen.get(h, 0), count[h]))
        seen[h] = seen.get(h, 0) + 1
    return out
