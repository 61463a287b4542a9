"""What every Dask worker of a run does when it starts, before any task: the ``--preload``
module of :mod:`rpeg.infra` (``rpeg.infra.cluster.PRELOAD``; LocalCluster, Slurm, and the
plugin sent to a scheduler the run attaches to).

* the bf16-safe tensor and batch serializers (:func:`rpeg.runtime.actors.serializers.register`);
* the worker's own threads (its event loop, task and offload threads) at one torch thread
  (:func:`rpeg.runtime.compute_thread.single_threaded`): the rank claims
  ``runtime.torch_threads`` on the thread that runs it, and no other thread opens an OpenMP
  team beside it.
"""

from __future__ import annotations


def setup() -> None:
    from rpeg.runtime import compute_thread
    from rpeg.runtime.actors import serializers

    serializers.register()
    compute_thread.single_threaded()


def dask_setup(worker: object = None) -> None:  # the ``--preload`` module hook
    setup()
