"""Accelerator catalog: peak rates, memory, and size-dependent efficiency curves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rpeg.errors import Problem
from rpeg.specs._load import Checker, SpecError, interp_log

Curve = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    hbm_gb: float
    hbm_tbps: float
    matmul_curve: Curve
    hbm_curve: Curve
    source: str = ""
    host_memory_gb: float = 0.0
    host_link_gbps: float = 0.0
    calibrated: bool = False
    # Device memory as the CUDA driver reports it (what vLLM's gpu_memory_utilization
    # multiplies); marketing "80 GB" parts report 80 GiB. 0 = same as hbm_gb.
    hbm_reported_gb: float = 0.0
    # Achieved fraction of this part's kernels relative to the (Hopper-measured) efficiency
    # curves: < 1 for a generation whose software stack is younger than its silicon.
    software_eff: float = 1.0
    # Fixed host-side time per transformer layer per pass per micro-batch on this device
    # (eager-mode op dispatch: CPU torch runs ~20 ops per layer at ~50 us each); 0 = use the
    # calibration's GPU figure (kernel launches, ``Calibration.layer_overhead_s``).
    layer_overhead_s: float = 0.0
    # Fixed time per MoE layer and forward call at ep > 1 on RPEG's runtime
    # (rpeg.runtime.expert_parallel): the routing's host work and the waits of its four
    # all-to-alls for the other ranks (each rank computes different rows between them),
    # beyond the bytes and link latency the all-to-all prices; a backward pays half (two
    # all-to-alls). 0 = not measured on this device: only bytes and latency are priced.
    ep_layer_overhead_s: float = 0.0

    @property
    def usable_hbm_gb(self) -> float:
        return self.hbm_reported_gb or self.hbm_gb

    def peak_flops(self, precision: str = "bf16") -> float:
        """Peak dense FLOP/s for ``precision`` (fp8 falls back to bf16 where absent)."""
        if precision == "fp8" and self.fp8_dense_tflops:
            return self.fp8_dense_tflops * 1e12
        if precision == "fp32":
            return (
                self.bf16_dense_tflops * 1e12 / 2
                if self.name != "cpu"
                else self.bf16_dense_tflops * 1e12
            )
        return self.bf16_dense_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tbps * 1e12

    def matmul_eff(self, flops: float) -> float:
        """Achieved fraction of peak for one GEMM of ``flops`` FLOPs."""
        return interp_log(self.matmul_curve, flops) * self.software_eff


def parse_gpus(sources: list[tuple[dict[str, Any], str]]) -> dict[str, GPUSpec]:
    """Parse the shipped file then user files (later entries replace earlier ones)."""
    problems: list[Problem] = []
    out: dict[str, GPUSpec] = {}
    for data, src in sources:
        top = Checker(src, data, problems)
        d = top.sub("defaults")
        dcurves = d.sub("efficiency") if d else None
        default_mm = dcurves.curve("matmul") if dcurves else None
        default_hbm = dcurves.curve("hbm") if dcurves else None
        if dcurves:
            dcurves.done()
        if d:
            d.done()
        if default_mm is None and out:
            first = next(iter(out.values()))
            default_mm, default_hbm = first.matmul_curve, first.hbm_curve
        gpus = top.sub("gpus", required=src.startswith("rpeg/"))
        top.done()
        if gpus is None:
            continue
        for name, entry in gpus.data.items():
            c = Checker(f"{src}: gpus.{name}", entry, problems)
            bf16 = c.num("bf16_dense_tflops", lo=1e-4, hi=20000, unit="TFLOP/s")
            fp8 = c.num("fp8_dense_tflops", lo=1e-4, hi=40000, default=None, unit="TFLOP/s")
            hbm = c.num("hbm_gb", lo=0.1, hi=2000, unit="GB")
            sw_eff = c.num("software_eff", lo=0.05, hi=1.0, default=1.0, unit="")
            hbm_rep = c.num("hbm_reported_gb", lo=0.0, hi=2000, default=0.0, unit="GB")
            bw = c.num("hbm_tbps", lo=1e-4, hi=100, unit="TB/s")
            host_gb = c.num("host_memory_gb", lo=0, hi=100000, default=0.0, unit="GB")
            host_bw = c.num("host_link_gbps", lo=0, hi=10000, default=0.0, unit="GB/s")
            eff = c.sub("efficiency")
            mm = eff.curve("matmul") if eff else None
            hb = eff.curve("hbm") if eff else None
            if eff:
                eff.done()
            src_text = c.text("source", default="")
            calibrated = c.flag("calibrated", False)
            lay_ms = c.num("layer_overhead_ms", lo=0, hi=1000, default=0.0, unit="ms")
            ep_ms = c.num("ep_layer_overhead_ms", lo=0, hi=1000, default=0.0, unit="ms")
            c.done()
            mm = mm or default_mm
            hb = hb or default_hbm
            if mm is None or hb is None:
                problems.append(
                    Problem(f"{src}: gpus.{name}", "no efficiency curves and no defaults")
                )
                continue
            out[name] = GPUSpec(
                name=name,
                bf16_dense_tflops=float(bf16),
                fp8_dense_tflops=float(fp8) if fp8 else None,
                hbm_gb=float(hbm),
                hbm_tbps=float(bw),
                matmul_curve=mm,
                hbm_curve=hb,
                source=src_text,
                host_memory_gb=float(host_gb),
                host_link_gbps=float(host_bw),
                calibrated=calibrated,
                hbm_reported_gb=float(hbm_rep),
                software_eff=float(sw_eff),
                layer_overhead_s=float(lay_ms) / 1e3,
                ep_layer_overhead_s=float(ep_ms) / 1e3,
            )
    if problems:
        raise SpecError(problems, title="invalid GPU catalog")
    return out
