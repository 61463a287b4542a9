"""CPU workers that outnumber the machine's cores (pure): the cluster such a plan runs on.
Used by :func:`rpeg.perf.pricing.predict` and ``price_unit``; docs/perf-model.md,
"Calibration from a run"."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rpeg.perf.units import unit_plan
from rpeg.plan.schema import Plan
from rpeg.specs import ClusterSpec


def time_shared(cluster: ClusterSpec, plan: Plan, units: list[Any]) -> ClusterSpec:
    """The cluster a plan runs on when its CPU "devices" outnumber the machine's cores.

    A CPU device is a one-thread worker process; a plan with more workers than cores (the
    shipped 4-device CPU configs on a 2-core machine) runs them time-sharing the cores, so
    each worker gets ``cores / workers`` of one: its compute, memory bandwidth and eager
    per-layer overhead scale by that share. Accelerators are refused as before."""
    need = max(unit_plan(plan, n).devices[-1] for n, _ in units) + 1
    if need <= cluster.num_devices or cluster.gpu.name != "cpu":
        return cluster
    share = cluster.num_devices / need
    g = cluster.gpu
    gpu = replace(
        g,
        bf16_dense_tflops=g.bf16_dense_tflops * share,
        hbm_tbps=g.hbm_tbps * share,
        layer_overhead_s=g.layer_overhead_s / share,
    )
    return replace(cluster, gpu=gpu, gpus_per_node=need, num_nodes=1)
