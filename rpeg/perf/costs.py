"""Cost formulas of the performance model: pure functions of specs and sizes (SI units:
seconds, bytes, FLOPs). Each one is hand-checked in tests/perf/test_costs.py and written
out in docs/perf-model.md."""

from __future__ import annotations

import math

from rpeg.perf.calibration import Calibration
from rpeg.specs import ClusterSpec, GPUSpec, ModelSpec

BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


# --- communication (alpha-beta) ---------------------------------------------------------
def allreduce_time(nbytes: float, ranks: int, bw: float, alpha: float, eff: float) -> float:
    """Ring all-reduce bandwidth term 2(p-1)/p * n / (bw*eff) plus a tree latency term
    2*log2(p)*alpha (NCCL picks tree/LL for small messages)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / (bw * eff) + 2.0 * math.log2(ranks) * alpha


def gather_time(nbytes: float, ranks: int, bw: float, alpha: float, eff: float) -> float:
    """Ring all-gather or reduce-scatter of a ``nbytes`` result: (p-1)/p * n / bw + (p-1) alpha."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (bw * eff) + (ranks - 1) * alpha


def group_link(
    cluster: ClusterSpec, first: int, size: int, stride: int = 1
) -> tuple[str, float, float]:
    """(level, bytes/s per GPU, latency) of the slowest link a group of ranks crosses."""
    level = cluster.span_level_contiguous(first, size, stride)
    link = cluster.link(level)
    return level, link.bytes_per_s, link.latency_s


def alltoall_time(
    nbytes: float, ranks: int, cluster: ClusterSpec, first: int, stride: int, eff: float
) -> tuple[float, str]:
    """All-to-all where each rank sends ``nbytes`` in total, split evenly among ``ranks``
    (ranks ``first + i*stride``). A rank whose scale-up domain holds ``c`` of the ranks sends
    ``(c-1)/p`` of its bytes over the domain fabric and ``(p-c)/p`` over its NIC,
    concurrently; the collective ends with the slowest rank, i.e. the one in the domain that
    holds the fewest ranks (a group straddling an NVL72 rack boundary is bound by its
    minority side): max_d max(n*(c_d-1)/p/bw_domain, n*(p-c_d)/p/bw_nic) + (p-1)*alpha."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0, "device"
    dom = cluster.domain_size
    span = (ranks - 1) * stride + 1
    level = cluster.span_level_contiguous(first, ranks, stride)
    intra = cluster.link("domain")
    outer = cluster.link(level if level != "domain" else "domain")
    # ranks per scale-up domain (arithmetic progression: count per domain block)
    counts: dict[int, int] = {}
    if span <= dom and first // dom == (first + span - 1) // dom:
        counts[first // dom] = ranks
    else:
        for i in range(ranks):
            d = (first + i * stride) // dom
            counts[d] = counts.get(d, 0) + 1
    t = 0.0
    for c in counts.values():
        f_in = (c - 1) / ranks
        f_out = (ranks - c) / ranks
        t = max(
            t,
            nbytes * f_in / (intra.bytes_per_s * eff),
            nbytes * f_out / (outer.bytes_per_s * eff) if f_out else 0.0,
        )
    t += (
        (ranks - 1) * (outer.latency_s if len(counts) > 1 else intra.latency_s) / max(1, ranks // 8)
    )
    return t, level


# --- model arithmetic -------------------------------------------------------------------
def train_flops(model: ModelSpec, tokens: float, seq_sq_sum: float, recompute: bool) -> float:
    """FLOPs of a training pass: (6 + 2*recompute) * N_active * tokens + attention, where the
    causal attention forward is L*(d_qk+d_v)*sum(s^2) (2 FLOPs/MAC, half of the square)."""
    passes = 4.0 if recompute else 3.0
    return passes * (2.0 * model.matmul_params * tokens + attn_fwd_flops(model, seq_sq_sum))


def forward_flops(model: ModelSpec, tokens: float, seq_sq_sum: float) -> float:
    """Forward-only FLOPs: 2 * N_active * tokens + causal attention."""
    return 2.0 * model.matmul_params * tokens + attn_fwd_flops(model, seq_sq_sum)


def attn_fwd_flops(model: ModelSpec, seq_sq_sum: float) -> float:
    return model.full_attn_layers * (model.attn_width + model.v_width) * seq_sq_sum


def attn_passes(passes: float, train: bool, calib: Calibration) -> float:
    """Attention forward-equivalents executed per training/forward pass set: the forward
    ones (1 per pass: forward + recompute) plus, in training, the flash-attention backward,
    which costs ``attn_bwd_fwd_ratio`` (2.5: 5 s^2-sized matmuls vs 2 in the forward, the
    scores being recomputed; Dao 2023, FlashAttention-2 Sec. 3.1) forward-equivalents
    instead of the 2 that the 6N/8N rule assumes."""
    if not train:
        return passes
    return passes - 2.0 + calib.attn_bwd_fwd_ratio


def kv_cache_bytes(model: ModelSpec, tokens: float, tp: int, bytes_per_value: float = 2.0) -> float:
    """KV-cache bytes per device for ``tokens`` cached tokens under tensor parallel ``tp``:
    GQA heads are split over min(tp, kv_heads) ranks; MLA's latent is replicated."""
    per_tok = model.kv_bytes_per_token(bytes_per_value)
    split = 1 if model.mla else min(tp, model.kv_heads)
    return tokens * per_tok / split


def weight_bytes_read(model: ModelSpec, batch: float, wbytes: float) -> float:
    """Weight bytes one decode step reads for ``batch`` sequences: all dense weights plus
    the routed experts the batch touches, E*(1-(1-k/E)^b) per MoE layer."""
    if not model.moe:
        return model.params * wbytes
    m = model.moe
    touched = m.experts * (1.0 - (1.0 - m.top_k / m.experts) ** max(batch, 1.0))
    experts_all = model.routed_expert_params
    experts_read = model.moe_layers * touched * model.expert_params
    return (model.params - experts_all + experts_read) * wbytes


def weight_bytes_read_dense(model: ModelSpec, wbytes: float) -> float:
    """Weight bytes outside the routed experts."""
    if not model.moe:
        return model.params * wbytes
    return (model.params - model.routed_expert_params) * wbytes


def layer_launch_s(gpu: GPUSpec, calib: Calibration) -> float:
    """The host's fixed cost of one layer's kernels per pass: the device's
    ``layer_overhead_ms`` where the catalog sets it, else the calibration's
    ``layer_overhead_s``."""
    return gpu.layer_overhead_s or calib.layer_overhead_s


def decode_host_s(batch: float, calib: Calibration) -> float:
    """The engine's host time in one decode step of ``batch`` sequences (scheduler, sampler,
    detokeniser): a fixed part and a part per live sequence."""
    return calib.decode_step_overhead_s + batch * calib.decode_seq_overhead_s


def decode_step_time(
    model: ModelSpec,
    gpu: GPUSpec,
    cluster: ClusterSpec,
    *,
    batch: float,
    context: float,
    tp: int,
    pp: int,
    first_device: int,
    wbytes: float,
    kvbytes: float,
    calib: Calibration,
    precision: str,
    verify: float = 1.0,
    eager: bool = False,
    _stage: bool = False,
) -> tuple[float, float, float, float]:
    """One decode step of ``batch`` sequences with mean ``context`` tokens on one replica.
    Returns (seconds, flops, hbm bytes, comm seconds). ``verify``: tokens per sequence the
    step runs (1 + draft tokens under speculative decoding): the weights and the KV cache
    are read once, the matmul and attention work and the TP all-reduces grow with it.

    t = max(bytes / (HBM * eff), flops / (peak * eff_gemm)) + TP all-reduces + overhead,
    bytes = weights read / (tp*pp) + batch*context*kv_bytes_per_token / kv_split.

    Under pipeline parallelism (``pp > 1``) that is one stage's step on one micro-batch; the
    engine splits the batch into ``pp`` micro-batches in flight (vLLM's virtual engines), so a
    sequence advances one token per ``pp`` stage steps of ``batch / pp`` sequences each: every
    stage's weights are read once per micro-batch, and a lone sequence of the tail waits on
    all ``pp`` stages in turn (its token costs the whole model's weights over ``tp``, not
    ``tp * pp``). Returned per token step of the whole batch (flops and bytes per device).
    """
    if pp > 1 and not _stage:
        micro = max(batch / pp, min(batch, 1.0))  # a sequence is not split
        t, f, b, c = decode_step_time(
            model, gpu, cluster, batch=micro, context=context, tp=tp, pp=pp,
            first_device=first_device, wbytes=wbytes, kvbytes=kvbytes, calib=calib,
            precision=precision, verify=verify, eager=eager, _stage=True,
        )  # fmt: skip
        return pp * t, pp * f, pp * b, pp * c
    shards = tp * pp
    w = weight_bytes_read(model, batch * verify, wbytes) / shards
    kv = kv_cache_bytes(model, batch * context, tp, kvbytes) / pp
    # hybrid linear attention: each live sequence's fixed state is read (and written) per step
    kv += batch * model.linear_state_bytes(kvbytes) / (tp * pp)
    nbytes = w + kv
    w_exp = 0.0
    if model.moe:
        w_exp = w - weight_bytes_read_dense(model, wbytes) / shards
    bw = gpu.hbm_bytes_per_s * gpu.software_eff
    kv_eff = calib.kv_hbm_eff or calib.decode_hbm_eff
    t_mem = (
        (w - w_exp) / (bw * calib.decode_hbm_eff)
        + w_exp / (bw * calib.moe_expert_hbm_eff)
        + kv / (bw * kv_eff)
    )
    flops = batch * verify * (2.0 * model.matmul_params + model.attn_flops_fwd(context)) / shards
    gemm = 2.0 * batch * verify * model.hidden * max(model.ffn_hidden, model.attn_width) / tp
    t_cmp = flops / (gpu.peak_flops(precision) * gpu.matmul_eff(gemm))
    t_comm = 0.0
    if tp > 1:
        _, bw, alpha = group_link(cluster, first_device, tp)
        t_comm = (
            2
            * model.layers
            / pp
            * allreduce_time(batch * verify * model.hidden * 2.0, tp, bw, alpha, calib.nccl_bus_eff)
        )
    overhead = decode_host_s(batch, calib)
    t_gpu = max(t_mem, t_cmp) + t_comm
    if eager:  # no CUDA graph: the host launches every layer's kernels, ahead of the device
        t_gpu = max(t_gpu, model.layers / pp * layer_launch_s(gpu, calib))
    return t_gpu + overhead, flops, nbytes, t_comm
