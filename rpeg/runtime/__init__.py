"""RPEG runtime: models, generation engines, RL algorithms, rewards, data and the
single-process reference trainer.

The modules of this package (not :mod:`rpeg.runtime.actors`, the distributed runtime on
Dask actors) are free of Dask and Prefect so that the distributed runtime can wrap the
same classes (:class:`rpeg.runtime.roles.PolicyWorker`, :class:`~rpeg.runtime.roles.CriticWorker`)
inside actors and call the same stage functions (:mod:`rpeg.runtime.stages`).
Submodules import torch/transformers; import them explicitly.
"""
