"""Hardware and model catalogs as data files, with validated loaders (pure).

The shipped catalogs live in ``rpeg/specs/data/*.yaml``; a user file of the same name in
``$RPEG_SPECS_DIR`` (default ``~/.config/rpeg``) adds or replaces entries (``rpeg specs
calibrate`` writes the measured ``cpu`` profile there). Every problem in a file is reported
at once as a :class:`SpecError`.
"""

from __future__ import annotations

from functools import lru_cache

from rpeg.errors import Problem
from rpeg.specs._load import SpecError, shipped_and_user, user_specs_dir
from rpeg.specs.clusters import ClusterSpec, Link, parse_clusters
from rpeg.specs.gpus import GPUSpec, parse_gpus
from rpeg.specs.models import MLASpec, ModelSpec, MoESpec, parse_models

__all__ = [
    "ClusterSpec",
    "GPUSpec",
    "Link",
    "MLASpec",
    "ModelSpec",
    "MoESpec",
    "SpecError",
    "add_run_model",
    "cluster",
    "clusters",
    "gpu",
    "gpus",
    "model",
    "models",
    "reload",
    "user_specs_dir",
]


@lru_cache(maxsize=1)
def gpus() -> dict[str, GPUSpec]:
    return parse_gpus(shipped_and_user("gpus.yaml"))


@lru_cache(maxsize=1)
def clusters() -> dict[str, ClusterSpec]:
    return parse_clusters(shipped_and_user("clusters.yaml"), gpus())


@lru_cache(maxsize=1)
def models() -> dict[str, ModelSpec]:
    return parse_models(shipped_and_user("models.yaml"))


def reload() -> None:
    """Forget cached catalogs (after a user file changed)."""
    gpus.cache_clear()
    clusters.cache_clear()
    models.cache_clear()


def _get(kind: str, table: dict, name: str):
    try:
        return table[name]
    except KeyError:
        raise SpecError(
            [Problem(kind, f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")]
        ) from None


def gpu(name: str) -> GPUSpec:
    return _get("gpu", gpus(), name)


#: models read at run time (a run's ``model.path`` config.json, rpeg.specs.hf), by name
_RUN_MODELS: dict[str, ModelSpec] = {}


def add_run_model(spec: ModelSpec) -> None:
    """Make ``spec`` (a model read from a run's own folder) known to :func:`model` in this
    process, beside the catalog, so that plans naming it are priced as that model."""
    _RUN_MODELS[spec.name] = spec


def model(name: str) -> ModelSpec:
    if name in _RUN_MODELS:
        return _RUN_MODELS[name]
    return _get("model", models(), name)


#: clusters derived at run time (a published run's node size, rpeg.perf.validation.row_cells), by name
_RUN_CLUSTERS: dict[str, ClusterSpec] = {}


def add_run_cluster(spec: ClusterSpec) -> None:
    """Make ``spec`` (derived from a catalog cluster) known to :func:`cluster` in this
    process, beside the catalog."""
    _RUN_CLUSTERS[spec.name] = spec


def cluster(
    name: str, *, num_nodes: int | None = None, num_devices: int | None = None
) -> ClusterSpec:
    """A named cluster, optionally resized to ``num_nodes`` (or enough for ``num_devices``)."""
    spec = _RUN_CLUSTERS.get(name) or _get("cluster", clusters(), name)
    return spec.sized(num_nodes=num_nodes, num_devices=num_devices)
