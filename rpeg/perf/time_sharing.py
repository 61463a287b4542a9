"""CPU workers that outnumber the machine's cores (pure). Used by
:func:`rpeg.perf.pricing.predict` and ``price_unit``; :func:`run_cluster` sizes the cluster
for the planner and ``rpeg calibrate``; docs/calibration.md, "Calibration from a run".

A CPU device is a one-thread worker process. A plan may place more workers than the machine
has cores (the shipped 4-device CPU configs on a 2-core machine); the operating system then
shares the cores among the workers that are busy at the same moment:

* a unit on ``w`` workers gets ``min(1, cores / w)`` of a core per worker while it runs
  (:func:`unit_context`): a synchronous step runs its units one after another, so only the
  unit's own workers compete (4 ranks on 2 cores: half a core each; 2 ranks: a core each);
* pools that run at the same time (bounded staleness, k >= 1) share the cores between them:
  the step is at least the CPU work of all units, ``sum(t_u * min(w_u, cores))``, over the
  cores (:func:`busy_floor`), besides the slower pool's own chain of units.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from rpeg.perf.eager_cpu import is_cpu
from rpeg.perf.units import unit_plan
from rpeg.plan.schema import Plan
from rpeg.specs import ClusterSpec


def run_cluster(name: str, num_devices: int | None = None) -> ClusterSpec:
    """The catalog cluster ``name`` that a run on ``num_devices`` devices is priced on (the
    planner's problem, ``rpeg calibrate``'s fit): a GPU cluster sized to enough nodes for the
    devices; a CPU cluster as the catalog states it -- its devices are the machine's cores,
    and a plan's workers beyond them share those cores (:func:`time_shared` in the pricing),
    as ``rpeg predict`` and ``rpeg bench`` price them. Sizing local-cpu to two nodes for a
    4-worker plan would price 4 cores on a 2-core machine."""
    from rpeg import specs

    cl = specs.cluster(name)
    if is_cpu(cl.gpu) or num_devices is None:
        return cl
    return cl.sized(num_devices=max(1, num_devices))


def time_shared(cluster: ClusterSpec, plan: Plan, units: list[Any]) -> ClusterSpec:
    """The cluster a plan runs on: a CPU cluster with fewer cores than the plan's highest
    device index holds one worker per device on its one node (each priced by
    :func:`unit_context` at its share of a core); anything else unchanged."""
    need = max(unit_plan(plan, n).devices[-1] for n, _ in units) + 1
    if need <= cluster.num_devices or not is_cpu(cluster.gpu):
        return cluster
    return replace(cluster, gpus_per_node=need, num_nodes=1)


def share(cores: int, workers: int) -> float:
    """The share of a core each of ``workers`` busy one-thread workers gets on ``cores``."""
    return min(1.0, cores / max(1, workers))


def unit_context(c: Any, cores: int, workers: int) -> Any:
    """``c`` (a :class:`rpeg.perf.units.UnitContext`) for a unit whose ``workers`` CPU
    processes share ``cores`` cores: compute, memory bandwidth, the eager per-layer
    overhead and the gloo link between them scaled by :func:`share`; ``c`` itself on
    accelerators or with a core each."""
    s = share(cores, workers)
    if s >= 1.0 or not is_cpu(c.gpu):
        return c
    g = c.gpu
    gpu = replace(
        g,
        bf16_dense_tflops=g.bf16_dense_tflops * s,
        hbm_tbps=g.hbm_tbps * s,
        layer_overhead_s=g.layer_overhead_s / s,
    )
    # gloo moves and reduces the bytes on the ranks' own cores: at a share s of a core its
    # bandwidth is s times, its latency 1/s times what two ranks with a core each see
    cl = c.cluster
    cl = replace(
        cl,
        gpu=gpu,
        intra_gbps=cl.intra_gbps * s,
        intra_latency_us=cl.intra_latency_us / s,
        collective_latency_s=None
        if cl.collective_latency_s is None
        else cl.collective_latency_s / s,
    )
    out = copy.copy(c)
    out.cluster, out.gpu, out.peak_flops = cl, gpu, c.peak_flops * s
    out.cpu_share = s  # a pipeline's idle slots go to the other workers (passes.bubble_factor)
    return out


def busy_floor(c: Any, cores: int, times: dict[str, float], workers: dict[str, int]) -> float:
    """The least time the units' CPU work takes on ``cores`` cores when they run at the same
    time: ``sum(t_u * min(w_u, cores)) / cores`` (0 on accelerators)."""
    if not is_cpu(c.gpu):
        return 0.0
    return sum(t * min(workers[n], cores) for n, t in times.items()) / max(1, cores)
