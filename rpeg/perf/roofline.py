"""The memory-bound share of a training or forward pass, by GPU (pure).

A pass's time is its GEMMs at the GPU's size curve plus work that is not a GEMM: norms,
activations, rotary, residual adds, dropout masks, the elementwise parts of the backward.
Those stream their tensors through memory, so they take bytes / HBM bandwidth, while the
GEMMs take FLOPs / peak. ``Calibration.train_eff_factor`` / ``forward_eff_factor`` (0.70 /
0.60) state the achieved share of the GEMM rate on the GPU they were set on, an H100 SXM
(NeMo-RL rows): non-GEMM time = (1/f - 1) x GEMM time there. On another GPU that ratio
scales with its ridge point, peak FLOP/s / HBM bytes/s: an H20 (148 TFLOP/s, 4.0 TB/s;
ridge 37 against the H100's 295) does the same memory-bound work in relatively 8x less
time, so its passes reach 0.95 / 0.92 of their GEMM rate, an A100 (ridge 153) 0.82 / 0.74.
docs/perf-model.md, "Equations" (Forward / train).
"""

from __future__ import annotations

from typing import Any

#: the ridge point (FLOP per byte: bf16 dense peak / HBM bandwidth) of the GPU the pass
#: factors were set on: H100 SXM, 989 TFLOP/s over 3.35 TB/s
REFERENCE_RIDGE = 989.0 / 3.35


def ridge(gpu: Any) -> float:
    """bf16 dense peak FLOP/s per HBM byte/s of ``gpu`` (a GPUSpec)."""
    return float(gpu.bf16_dense_tflops) / float(gpu.hbm_tbps)


def pass_factor(factor: float, gpu: Any) -> float:
    """The achieved share of the GEMM rate of a pass on ``gpu`` whose share on the reference
    GPU is ``factor``: ``1 / (1 + (1/factor - 1) x ridge / REFERENCE_RIDGE)``."""
    if factor <= 0 or factor >= 1:
        return factor
    return 1.0 / (1.0 + (1.0 / factor - 1.0) * ridge(gpu) / REFERENCE_RIDGE)
