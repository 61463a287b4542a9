"""A Slurm-backed Dask cluster on its own (``cluster.kind: slurm`` without a run).

    python infra/slurm/jobqueue_cluster.py [infra/slurm/alps-gh200.yaml] [--workers 8] [--print-script]

Run it on a login node: it starts the Dask scheduler *here* (on ``cluster.interface``), submits
the jobs of ``--workers`` workers (one job per node, one srun task per GPU: the same jobs a run
with ``cluster.kind: slurm`` submits, rpeg.infra.slurm_cluster), prints the scheduler address
and waits. Point runs at it with ``cluster.address`` (kind local), ``--cluster tcp://...`` on
``rpeg train``, or ``--param cluster_address=...`` on ``rpeg deploy``; several runs can then
share the allocation. ``--print-script`` prints the sbatch script and exits (nothing submitted).
The YAML is a run config (only its ``cluster`` section is read, validated like any run's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

DEFAULT = Path(__file__).with_name("alps-gh200.yaml")


def load_recipe(path: str | Path = DEFAULT) -> Any:
    """The ``cluster`` section of a run-config YAML, validated (a ``ConfigError`` names the
    field and the allowed values); it must be ``kind: slurm``."""
    from rpeg.config import RunConfig
    from rpeg.errors import ConfigError, Problem

    data = yaml.safe_load(Path(path).read_text()) or {}
    cc = RunConfig.from_dict({"cluster": data.get("cluster") or {}}).cluster
    if cc.kind != "slurm":
        raise ConfigError([Problem("cluster.kind", f"{path}: got {cc.kind!r}; allowed: 'slurm'")])
    return cc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", nargs="?", default=str(DEFAULT))
    ap.add_argument("--workers", type=int, default=None, help="default: one node's")
    ap.add_argument("--print-script", action="store_true")
    a = ap.parse_args(argv)
    from rpeg.infra import slurm_cluster
    from rpeg.infra.cluster import configure_dask

    cc = load_recipe(a.recipe)
    n = a.workers or cc.slurm.per_node * (cc.slurm.nodes or 1)
    if a.print_script:
        from dask_jobqueue import SLURMCluster

        kw = slurm_cluster.job_kwargs(cc, n, sec=slurm_cluster.security(cc))
        # this machine may lack the interface: a scheduler on loopback, only to print the
        # script (its scheduler address is then 127.0.0.1; the rest is what a run submits)
        kw["scheduler_options"]["interface"] = "lo"
        cluster = SLURMCluster(**kw)
        print(cluster.job_script())
        cluster.close()
        return 0
    configure_dask()
    client, cluster = slurm_cluster.start(cc, n)
    print(
        f"scheduler: {cluster.scheduler_address}  jobs {slurm_cluster.job_ids(cluster)}  "
        "(Ctrl-C closes the cluster and cancels the jobs)",
        flush=True,
    )
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        client.close()
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
