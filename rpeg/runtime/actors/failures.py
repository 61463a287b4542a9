"""Why an actor call failed, decided by the exception's type.

* ``worker_lost``: the process holding the actor is gone or unreachable. The run rolls back
  to its last checkpoint. Types: ``distributed.KilledWorker``, ``CommClosedError`` (and
  ``StreamClosedError`` underneath), ``ConnectionError``, ``TimeoutError`` (=
  ``asyncio.TimeoutError``), and the bare ``OSError`` an actor handle raises when it cannot
  reach its worker ("Unable to contact Actor's worker": no errno, exact type ``OSError``).
* ``oom``: ``torch.OutOfMemoryError`` (CUDA) or ``MemoryError``: reported with the unit and
  never retried (the same step would run out of memory again).
* ``None``: anything else (a bug, bad data, a storage error such as a full disk or a
  permission denied, which carry an errno): raised as it is.

:func:`start_with_retries`: a worker lost while a run's actors start is retried the way a
lost worker mid-run is (abandon, start again on the live workers), without a checkpoint.
"""

from __future__ import annotations

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


def classify(exc: BaseException) -> Kind | None:
    """``"worker_lost"``, ``"oom"`` or None (see the module doc)."""
    if isinstance(exc, _oom_types()):
        return "oom"
    if isinstance(exc, (ActorLost, *_lost_types())):
        return "worker_lost"
    # the actor handle's own "Unable to contact Actor's worker": a bare OSError, no errno
    # (a storage error has one: ENOSPC, EACCES, EROFS, ...)
    if type(exc) is OSError and exc.errno is None:
        return "worker_lost"
    return None


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
