"""Why an actor call failed, decided by the exception's type.

* ``worker_lost``: the process holding the actor is gone or unreachable. The run rolls back
  to its last checkpoint. Types: ``distributed.KilledWorker``, ``CommClosedError`` (and
  ``StreamClosedError`` underneath), ``ConnectionError``, ``TimeoutError`` (=
  ``asyncio.TimeoutError``), and the bare ``OSError`` an actor handle raises when it cannot
  reach its worker ("Unable to contact Actor's worker": no errno, exact type ``OSError``).
* a collective that broke because a peer is gone (``torch.distributed.DistNetworkError``,
  or a ``RuntimeError`` / ``DistBackendError`` whose message is one of the transport's
  lost-peer messages, :data:`PEER_LOST_MESSAGES`: gloo's "Connection reset by peer" / "Read
  error" from ``pair.cc``, a timed-out collective, NCCL's aborted communicator or watchdog
  timeout) is ``worker_lost`` too: the rank that raised it is intact, its peer is not.
* ``oom``: ``torch.OutOfMemoryError`` (CUDA), ``MemoryError``, or a ``RuntimeError`` with one
  of CUDA's allocation failures (:data:`CUDA_OOM_MESSAGES`: cuBLAS, NCCL): reported with the
  unit and the plan's predicted memory, never retried (the same step would run out again).
* ``None``: anything else (a bug, bad data, a storage error such as a full disk or a
  permission denied, which carry an errno): raised as it is.

:func:`start_with_retries`: a worker lost while a run's actors start is retried the way a
lost worker mid-run is (abandon, start again on the live workers), without a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

Kind = Literal["worker_lost", "oom"]


def _lost_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        from distributed import KilledWorker
        from distributed.comm.core import CommClosedError

        types += [KilledWorker, CommClosedError]
    except ImportError:  # pragma: no cover - distributed is a runtime dependency
        pass
    try:
        from tornado.iostream import StreamClosedError

        types.append(StreamClosedError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def _oom_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [MemoryError]
    try:
        import torch

        types.append(torch.OutOfMemoryError)
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return tuple(types)


class ActorLost(RuntimeError):
    """Raised by the typed proxies when an actor's handle reports its worker gone."""


#: substrings of a collective's error that mean "a peer is gone", not "this rank is wrong"
#: (gloo's tcp transport, torch's store and c10d, NCCL's abort and watchdog)
PEER_LOST_MESSAGES = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Connection refused",
    "Broken pipe",
    "Read error",
    "Write error",
    "pair.cc",
    "Timed out waiting",
    "Timed out after",
    "Socket Timeout",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
    "remote process exited",
    "ProcessGroup is aborted",
    "process group has been destroyed",
)


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that broke because a peer is gone (module doc)."""
    try:
        from torch.distributed import DistNetworkError

        if isinstance(exc, DistNetworkError):
            return True
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        pass
    if not isinstance(exc, RuntimeError) or isinstance(exc, ActorLost):
        return False
    text = str(exc)
    return any(m in text for m in PEER_LOST_MESSAGES)


#: CUDA allocation failures that reach Python as a plain RuntimeError / DistBackendError
#: (outside the caching allocator: cuBLAS workspaces, NCCL buffers, a raw cudaMalloc): out of
#: memory as much as ``torch.OutOfMemoryError``, never a lost peer
CUDA_OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "Cuda failure 'out of memory'",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
)


def classify(exc: BaseException) -> Kind | None:
    """``"worker_lost"``, ``"oom"`` or None (see the module doc)."""
    if isinstance(exc, _oom_types()):
        return "oom"
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in CUDA_OOM_MESSAGES):
        return "oom"
    if isinstance(exc, (ActorLost, *_lost_types())):
        return "worker_lost"
    # the actor handle's own "Unable to contact Actor's worker": a bare OSError, no errno
    # (a storage error has one: ENOSPC, EACCES, EROFS, ...)
    if type(exc) is OSError and exc.errno is None:
        return "worker_lost"
    if peer_lost(exc):
        return "worker_lost"
    return None


def first_cause(errors: Sequence[BaseException]) -> BaseException:
    """Of the errors the ranks of one call raised, the one that says why: a lost worker
    (the process is gone) first, then any other error (a bug, bad data, out of memory: a
    peer of that rank fails inside the collective only because of it), then a collective
    broken by a lost peer. Rank order within each kind."""

    def rank(e: BaseException) -> int:
        if peer_lost(e):
            return 2
        return 0 if classify(e) == "worker_lost" else 1

    return min(errors, key=rank)


def start_with_retries(run: Any, retries: int, warn: Any = None) -> int:
    """``run.start_actors()`` (a :class:`rpeg.runtime.actors.driver.DistributedRun`); a
    worker lost while the actors start (:func:`classify`: ``worker_lost``) restarts the
    survivors (``run.abandon()``) and starts every actor again on the live workers
    (``run.restart_actors()``), up to ``retries`` times -- nothing has trained yet, so there
    is nothing to restore. ``warn(message)`` hears each retry. Returns the retries used."""
    for attempt in range(retries + 1):
        try:
            if attempt == 0:
                run.start_actors()
            else:
                run.restart_actors()
            return attempt
        except Exception as exc:
            if classify(exc) != "worker_lost" or attempt == retries:
                raise
            if warn is not None:
                warn(
                    f"a worker was lost while the actors started ({type(exc).__name__}: "
                    f"{exc}); starting them again ({attempt + 1} of {retries})"
                )
            run.abandon()
    raise AssertionError("unreachable")
