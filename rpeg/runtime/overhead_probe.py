"""Micro-benchmarks behind `rpeg specs calibrate` that need torch (the spec layer is pure).

``eager_layer_overhead_s`` measures what the CPU profile's ``layer_overhead_ms`` stands for:
the per-layer, per-pass time of a transformer block in eager PyTorch that is not matmul work
(op dispatch, autograd bookkeeping, small element-wise kernels). The block is the Llama shape
of the built-in tiny model (RMSNorm, QKV, causal SDPA, out-projection, RMSNorm, SwiGLU MLP).
"""

from __future__ import annotations

import statistics
import time

import torch


class _Block(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, heads: int):
        super().__init__()
        self.heads = heads
        self.n1 = torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.n2 = torch.nn.RMSNorm(hidden)
        self.gate_up = torch.nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
        g, u = self.gate_up(self.n2(x)).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(g) * u)


def _fwd_bwd_s(layers: int, hidden: int, ffn: int, heads: int, tokens: int, repeats: int) -> float:
    model = torch.nn.Sequential(*[_Block(hidden, ffn, heads) for _ in range(layers)])
    x = torch.randn(1, tokens, hidden)

    def once() -> None:
        model(x).sum().backward()

    for _ in range(10):
        once()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            once()
        samples.append((time.perf_counter() - t0) / repeats)
    return statistics.median(samples)


def eager_layer_overhead_s(
    matmul_flops_per_s: float,
    *,
    hidden: int = 256,
    ffn: int = 1024,
    heads: int = 4,
    tokens: int = 16,
    repeats: int = 30,
) -> float:
    """Non-matmul seconds per layer per pass (forward = 1 pass, backward = 2).

    The 4-layer minus 1-layer time isolates the per-layer cost from the constant part (loss,
    launch); the matmul FLOPs of a layer (fwd + bwd = 3 x the forward's) at
    ``matmul_flops_per_s`` are subtracted; the rest is divided by the 3 passes.
    """
    torch.set_num_threads(1)
    per_layer = (
        _fwd_bwd_s(4, hidden, ffn, heads, tokens, repeats)
        - _fwd_bwd_s(1, hidden, ffn, heads, tokens, repeats)
    ) / 3
    fwd_flops = (
        2 * tokens * (hidden * 3 * hidden + hidden * hidden + hidden * 2 * ffn + ffn * hidden)
    )
    matmul_s = 3 * fwd_flops / matmul_flops_per_s
    return max(0.0, (per_layer - matmul_s) / 3)
