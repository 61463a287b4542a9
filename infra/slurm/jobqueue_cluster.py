"""Dask on SLURM through dask-jobqueue (GH200 on CSCS Alps by default).

    python infra/slurm/jobqueue_cluster.py [infra/slurm/alps-gh200.yaml] [--jobs 2] [--print-script]

Run it on a login node (or inside a small allocation): it starts a Dask scheduler *here*,
submits ``jobs`` SLURM jobs whose workers connect back, prints the scheduler address and
waits. Point RPEG at it with ``cluster.address`` in the run config, ``--param
cluster_address=tcp://...`` on ``rpeg deploy``, or the "Dask scheduler" field of the UI form.
``--print-script`` prints the generated sbatch script and exits (no job submitted).

dask-jobqueue is imported lazily (``pip install dask-jobqueue``); nothing in RPEG needs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

DEFAULT = Path(__file__).with_name("alps-gh200.yaml")
REQUIRED = (
    "queue",
    "cores",
    "processes",
    "memory",
    "walltime",
    "worker_extra_args",
    "job_extra_directives",
)


def load_recipe(path: str | Path = DEFAULT) -> dict[str, Any]:
    """Read and check a recipe: {cluster: SLURMCluster kwargs, jobs: int, dask_config: {...}}."""
    data = yaml.safe_load(Path(path).read_text())
    cl = data.get("cluster") or {}
    missing = [k for k in REQUIRED if k not in cl]
    if missing:
        raise ValueError(f"{path}: cluster section lacks {missing}")
    args = cl["worker_extra_args"]
    if "--resources" not in args or args[args.index("--resources") + 1] != "device=1":
        raise ValueError(
            f"{path}: worker_extra_args must carry '--resources device=1' (one actor per device)"
        )
    if cl["cores"] % cl["processes"]:
        raise ValueError(
            f"{path}: cores ({cl['cores']}) must be a multiple of processes ({cl['processes']})"
        )
    return data


def make_cluster(path: str | Path = DEFAULT, jobs: int | None = None):
    """Start the SLURMCluster of a recipe and scale it to ``jobs`` jobs."""
    import dask

    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as exc:  # pragma: no cover - optional
        raise SystemExit("dask-jobqueue is not installed: pip install dask-jobqueue") from exc
    recipe = load_recipe(path)
    dask.config.set(recipe.get("dask_config") or {})
    kw = {k: v for k, v in recipe["cluster"].items() if v is not None}
    cluster = SLURMCluster(**kw)
    cluster.scale(jobs=jobs or recipe.get("jobs", 1))
    return cluster


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", nargs="?", default=str(DEFAULT))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--print-script", action="store_true")
    a = ap.parse_args(argv)
    cluster = make_cluster(a.recipe, 0 if a.print_script else a.jobs)
    if a.print_script:
        print(cluster.job_script())
        cluster.close()
        return 0
    print(
        f"scheduler: {cluster.scheduler_address}  (Ctrl-C closes the cluster and cancels the jobs)",
        flush=True,
    )
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
