"""The training entry's seam for tests and benchmarks: what they give a distributed run that
a user never does, kept out of :func:`rpeg.flows.train.train`'s signature.

* ``cluster``: an already running cluster object (``rpeg.infra.cluster.start_cluster``'s),
  shared by many runs instead of one LocalCluster per run;
* ``fault_hook(run, step)``: called at every step's start (a test kills a worker there);
* ``keep_extra``: the summary keeps ``_extra`` (timeline, stage spans, weight syncs, history,
  parameter checksums) for the caller to inspect.

Set for one call with :func:`train_seam` (a context variable: it holds only inside the
``with`` block and only in this thread); :func:`rpeg.flows.entry.train_on` is that around one
run::

    from rpeg.flows.entry import train_on
    summary = train_on(cluster, config, progress=False)   # summary["_extra"]["timeline"]

With any of them set, the distributed run skips the Prefect API start-up and runs its flow
body in a local flow run (as tests always did), on the given cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainSeam:
    cluster: Any = None
    fault_hook: Callable[[Any, int], None] | None = None
    keep_extra: bool = False

    @property
    def active(self) -> bool:
        return self.cluster is not None or self.fault_hook is not None or self.keep_extra


_NONE = TrainSeam()
_SEAM: ContextVar[TrainSeam | None] = ContextVar("rpeg_train_seam", default=None)


def current_seam() -> TrainSeam:
    """The seam set by the innermost :func:`train_seam` (an inactive one outside)."""
    return _SEAM.get() or _NONE


@contextmanager
def train_seam(
    *,
    cluster: Any = None,
    fault_hook: Callable[[Any, int], None] | None = None,
    keep_extra: bool = False,
) -> Iterator[TrainSeam]:
    """Runs of :func:`rpeg.flows.train.train` inside the block get these (see the module)."""
    seam = TrainSeam(cluster=cluster, fault_hook=fault_hook, keep_extra=keep_extra)
    token = _SEAM.set(seam)
    try:
        yield seam
    finally:
        _SEAM.reset(token)


__all__ = ["TrainSeam", "current_seam", "train_seam"]
