"""rpeg.infra: bring up Dask (LocalCluster, an existing tcp:// scheduler) and configure it
for torch (non-daemon workers, one torch thread per process, bf16-safe serializers)."""

from rpeg.infra.cluster import Cluster, configure_dask, prefect_env, start_cluster

__all__ = ["Cluster", "configure_dask", "prefect_env", "start_cluster"]
