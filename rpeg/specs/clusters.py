"""Cluster topology catalog: devices per node, scale-up domain, NICs, racks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rpeg.errors import Problem
from rpeg.specs._load import Checker, SpecError
from rpeg.specs.gpus import GPUSpec

FABRICS = ("nvswitch", "nvlink", "nvlink-c2c", "infinity-fabric", "hccs", "ub", "none")
LEVELS = ("device", "domain", "rack", "cluster")


@dataclass(frozen=True)
class Link:
    """One level of the hierarchy: per-GPU bandwidth (bytes/s, per direction), latency (s)."""

    level: str
    bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpu: GPUSpec
    gpus_per_node: int
    num_nodes: int
    nodes_per_rack: int
    fabric: str
    intra_gbps: float
    intra_latency_us: float
    nics_per_node: int
    gbps_per_nic: float
    nic_latency_us: float
    oversubscription: float
    uplink_latency_us: float
    nvlink_domain: int = 0
    source: str = ""
    # Orchestration costs of the runtime that drives this cluster (overrides of the
    # Calibration defaults; None = use the calibration): per execution unit per step
    # (`dispatch_s`), per cross-process hand-off of a unit's inputs (`handoff_latency_s`),
    # per step (`step_overhead_s`). Measured for local-cpu (Prefect + Dask actors).
    dispatch_s: float | None = None
    handoff_latency_s: float | None = None
    step_overhead_s: float | None = None
    # the runtime reuses the sampling log-probs as old log-probs when the rollout ran on the
    # trainer's current weights (one model for sampling and training: rpeg's CPU runtime)
    reuses_rollout_logprobs: bool = False
    # per weight tensor of a refit (replaces Calibration.refit_s_per_gb): rpeg's CPU runtime
    # copies a state dict in process, far cheaper than a GPU stack's per-tensor collective +
    # engine load
    refit_tensor_s: float | None = None
    # host work per sample of a rule reward (overrides Calibration.host_per_sample_s): rpeg's
    # CPU runtime scores short arithmetic answers in the rank, no detokenising of long traces
    host_per_sample_s: float | None = None
    # the latency of one collective call the runtime issues from Python inside a pass (context
    # parallelism's key/value gathers and sums, per-tensor gradient sums): gloo on CPU workers
    # wakes its worker threads after the rank's compute (benchmarks/bench_collectives.py);
    # None = the link's latency (NCCL)
    collective_latency_s: float | None = None

    @property
    def num_devices(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def domain_size(self) -> int:
        """GPUs joined by the scale-up fabric (the node, or an NVL72 rack)."""
        return self.nvlink_domain or self.gpus_per_node

    @property
    def rack_size(self) -> int:
        return self.gpus_per_node * self.nodes_per_rack

    def with_node_size(self, gpus_per_node: int) -> ClusterSpec:
        """This cluster's GPU, links and per-GPU network share with ``gpus_per_node`` GPUs a
        node (a published run on a node size the catalog lacks): NICs scale with the GPUs,
        a scale-up domain that was the node stays the node; named ``<name>-<n>-per-node``."""
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node={gpus_per_node}: must be >= 1")
        ratio = gpus_per_node / self.gpus_per_node
        node_domain = self.nvlink_domain in (0, self.gpus_per_node)
        return replace(
            self,
            name=f"{self.name}-{gpus_per_node}-per-node",
            gpus_per_node=gpus_per_node,
            nics_per_node=max(1, round(self.nics_per_node * ratio)),
            nvlink_domain=0 if node_domain else self.nvlink_domain,
            source=f"{self.name} with {gpus_per_node} GPUs per node (derived)",
        )

    def sized(self, *, num_nodes: int | None = None, num_devices: int | None = None) -> ClusterSpec:
        """The same cluster with ``num_nodes`` nodes (or enough nodes for ``num_devices``)."""
        if num_devices is not None:
            num_nodes = max(1, -(-num_devices // self.gpus_per_node))
        if num_nodes is None or num_nodes == self.num_nodes:
            return self
        if num_nodes < 1:
            raise SpecError(
                [Problem(f"cluster {self.name}", f"num_nodes must be >= 1 (got {num_nodes})")]
            )
        return replace(self, num_nodes=num_nodes)

    def locate(self, device: int) -> tuple[int, int, int]:
        """(rack, node, gpu-in-node) of a global device index."""
        node, gpu = divmod(device, self.gpus_per_node)
        return node // self.nodes_per_rack, node, gpu

    def span_level(self, devices: tuple[int, ...] | range) -> str:
        """The outermost hierarchy level a group of devices spans."""
        if len(devices) <= 1:
            return "device"
        lo, hi = min(devices), max(devices)
        if lo // self.domain_size == hi // self.domain_size:
            return "domain"
        if lo // self.rack_size == hi // self.rack_size:
            return "rack"
        return "cluster"

    def span_level_contiguous(self, first: int, size: int, stride: int = 1) -> str:
        """Level spanned by ``size`` ranks starting at ``first`` with ``stride`` (no tuple)."""
        if size <= 1:
            return "device"
        last = first + (size - 1) * stride
        if first // self.domain_size == last // self.domain_size:
            return "domain"
        if first // self.rack_size == last // self.rack_size:
            return "rack"
        return "cluster"

    def link(self, level: str) -> Link:
        if level in ("device", "domain"):
            return Link(level, self.intra_gbps * 1e9, self.intra_latency_us * 1e-6)
        nic_per_gpu = self.nics_per_node * self.gbps_per_nic / self.gpus_per_node * 1e9
        if level == "rack":
            return Link(level, nic_per_gpu, self.nic_latency_us * 1e-6)
        return Link(level, nic_per_gpu / self.oversubscription, self.uplink_latency_us * 1e-6)


def parse_clusters(
    sources: list[tuple[dict[str, Any], str]], gpus: dict[str, GPUSpec]
) -> dict[str, ClusterSpec]:
    problems: list[Problem] = []
    out: dict[str, ClusterSpec] = {}
    for data, src in sources:
        top = Checker(src, data, problems)
        cl = top.sub("clusters", required=src.startswith("rpeg/"))
        top.done()
        if cl is None:
            continue
        for name, entry in cl.data.items():
            c = Checker(f"{src}: clusters.{name}", entry, problems)
            gpu = c.text("gpu")
            if gpu and gpu not in gpus:
                problems.append(
                    Problem(
                        f"{c.where}.gpu", f"unknown GPU {gpu!r}; known: {', '.join(sorted(gpus))}"
                    )
                )
            gpn = c.num("gpus_per_node", lo=1, hi=128, integer=True)
            nn = c.num("num_nodes", lo=1, hi=100000, integer=True, default=1)
            npr = c.num("nodes_per_rack", lo=1, hi=1024, integer=True, default=1)
            dom = c.num("nvlink_domain", lo=1, hi=100000, integer=True, default=0)
            intra = c.sub("intra_node", required=True)
            fabric = intra.text("fabric", choices=FABRICS)
            igb = intra.num("gbps", lo=0.01, hi=10000, unit="GB/s")
            ilat = intra.num("latency_us", lo=0, hi=10000, default=5.0, unit="us")
            intra.done()
            nic = c.sub("nic", required=True)
            nics = nic.num("nics_per_node", lo=1, hi=64, integer=True)
            gpn_nic = nic.num("gbps_per_nic", lo=0.01, hi=1000, unit="GB/s")
            nlat = nic.num("latency_us", lo=0, hi=10000, default=10.0, unit="us")
            nic.done()
            up = c.sub("rack_uplink")
            over = up.num("oversubscription", lo=1.0, hi=64, default=1.0) if up else 1.0
            ulat = up.num("latency_us", lo=0, hi=10000, default=15.0, unit="us") if up else 15.0
            if up:
                up.done()
            rt = c.sub("runtime")
            disp = hlat = sov = refit = hps = coll = None
            reuse = False
            if rt:
                disp = rt.num("dispatch_ms", lo=0, hi=100000, default=None, unit="ms")
                hlat = rt.num("handoff_latency_ms", lo=0, hi=100000, default=None, unit="ms")
                sov = rt.num("step_overhead_s", lo=0, hi=100000, default=None, unit="s")
                reuse = rt.flag("reuses_rollout_logprobs", False)
                refit = rt.num("refit_tensor_ms", lo=0, hi=100000, default=None, unit="ms")
                hps = rt.num("host_per_sample_ms", lo=0, hi=100000, default=None, unit="ms")
                coll = rt.num("collective_latency_ms", lo=0, hi=100000, default=None, unit="ms")
                rt.done()
            source = c.text("source", default="")
            c.done()
            if dom and isinstance(gpn, int) and gpn and dom % gpn:
                problems.append(
                    Problem(
                        f"{c.where}.nvlink_domain",
                        f"{dom} must be a multiple of gpus_per_node={gpn}",
                    )
                )
            if gpu not in gpus:
                continue
            out[name] = ClusterSpec(
                name=name,
                gpu=gpus[gpu],
                gpus_per_node=gpn,
                num_nodes=nn,
                nodes_per_rack=npr,
                fabric=fabric,
                intra_gbps=float(igb),
                intra_latency_us=float(ilat),
                nics_per_node=nics,
                gbps_per_nic=float(gpn_nic),
                nic_latency_us=float(nlat),
                oversubscription=float(over),
                uplink_latency_us=float(ulat),
                nvlink_domain=dom,
                source=source,
                dispatch_s=None if disp is None else float(disp) / 1e3,
                handoff_latency_s=None if hlat is None else float(hlat) / 1e3,
                step_overhead_s=None if sov is None else float(sov),
                reuses_rollout_logprobs=bool(reuse),
                refit_tensor_s=None if refit is None else float(refit) / 1e3,
                host_per_sample_s=None if hps is None else float(hps) / 1e3,
                collective_latency_s=None if coll is None else float(coll) / 1e3,
            )
    if problems:
        raise SpecError(problems, title="invalid cluster catalog")
    return out
