"""The collectives' network settings of a run's workers, from its cluster config (pure).

NCCL and gloo pick their socket interface themselves unless told (``NCCL_SOCKET_IFNAME``,
``GLOO_SOCKET_IFNAME``), and NCCL falls back to TCP sockets when the network plugin a fabric
needs (aws-ofi-nccl on Slingshot) is missing unless ``NCCL_NET`` names it. Every kind of
cluster gets them: a LocalCluster through its workers' environment, a Slurm cluster through
its job script (rpeg.infra.slurm_cluster), an existing scheduler's workers through a worker
plugin (rpeg.infra.cluster.start_cluster), each before any process group is created.
"""

from __future__ import annotations

from typing import Any


def collective_env(cluster_config: Any = None) -> dict[str, str]:
    """The workers' network variables of the collectives from ``cluster.interface`` and
    ``cluster.nccl_net`` (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``, ``NCCL_NET``),
    then ``cluster.worker_env``; {} when the config names none."""
    cc = cluster_config
    env: dict[str, str] = {}
    iface = getattr(cc, "interface", None)
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
        env["GLOO_SOCKET_IFNAME"] = iface
    if getattr(cc, "nccl_net", None):
        env["NCCL_NET"] = cc.nccl_net
    env.update(getattr(cc, "worker_env", None) or {})
    return env
