"""The few named calibration constants of the performance model (all documented in
docs/perf-model.md). They are physical efficiencies and overheads, shared by every plan; none
is fitted per validation row."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    # Decode is memory-bound: achieved share of peak HBM bandwidth when streaming weights and
    # KV (vLLM paged attention + CUDA graphs reach ~70-80% on H100).
    decode_hbm_eff: float = 0.75
    # MoE decode: achieved share of HBM bandwidth when streaming routed-expert weights
    # (vLLM fused-MoE Triton kernels at 1-8 tokens per expert: ~60%, below dense GEMV's ~75%
    # because each expert is a separate small tile loop).
    moe_expert_hbm_eff: float = 0.6
    # Fixed engine time per decode step (scheduler, sampling, detokenisation, launch) in s.
    decode_step_overhead_s: float = 0.004
    # Non-GEMM share of a training/forward micro-batch: achieved MFU = GEMM efficiency (size
    # curve of the GPU) x this factor (attention kernels, norms, optimizer, packing, launch).
    train_eff_factor: float = 0.70
    # Extra factor for forward-only passes (logprobs): short kernels, no overlap of comm.
    forward_eff_factor: float = 0.60
    # Fixed time per layer per micro-batch per pass in training/forward (kernel launches,
    # host syncs). MoE layers pay more: dropless token-count sync, permute/unpermute, a2a
    # latency (Megatron-Core MoE).
    layer_overhead_s: float = 0.0002
    moe_layer_overhead_s: float = 0.003
    # Weight refit trainer -> rollout engine: fixed cost per weight tensor of the HF layout
    # (layout conversion, per-tensor gather/broadcast or IPC handle, engine-side load), s.
    # ~1 ms: a Python-driven collective + vLLM load_weights call per tensor. Dominates for
    # fine-grained MoE (DeepSeek-V3: 45k tensors -> ~55 s per step, any GPU count).
    refit_tensor_s: float = 0.0012
    # Flash-attention backward / forward cost ratio (hardware FLOPs): the backward recomputes
    # the s^2 scores and runs 5 s^2-sized matmuls against 2 in the forward (FlashAttention-2,
    # Dao 2023). A kernel fact, not fitted: matters at long context (9-30k tokens).
    attn_bwd_fwd_ratio: float = 2.5
    # NCCL achieved bus bandwidth / link peak for large messages.
    nccl_bus_eff: float = 0.70
    # Effective host<->device copy bandwidth (PCIe gen5 x16 in practice), GB/s, for offload.
    host_link_gbps: float = 25.0
    # Fixed per-RL-step orchestration overhead (Ray/actor calls, data marshalling), s.
    # A cluster's `runtime.step_overhead_s` (clusters.yaml) overrides it.
    step_overhead_s: float = 3.0
    # Per execution unit per step: launching the unit's task and the call into its worker
    # processes (GPU stacks: a Ray actor method call + result fetch, ~1-5 ms; Prefect+Dask:
    # measured per cluster, clusters.yaml `runtime.dispatch_ms`). Fusion saves one per
    # unit it removes.
    dispatch_s: float = 0.005
    # Per hand-off of a unit's inputs from another process group (one object-store put/get
    # or actor->actor message), s; the bytes of the fields go over the link spanning both
    # device sets on top of it. Clusters override it (`runtime.handoff_latency_ms`).
    handoff_latency_s: float = 0.001
    # Bytes per element of the data fields handed between units (token ids int64, masks
    # bool, per-token float fields fp32, rewards one fp32 per sample).
    token_id_bytes: float = 8.0
    token_float_bytes: float = 4.0
    # Length distribution of responses: lognormal with this sigma, truncated at the cap
    # (RL reasoning traces are heavy-tailed: a few % run into the cap even at mean << cap).
    length_sigma: float = 1.0
    # vLLM V1 default max_num_seqs on >= 70 GB GPUs (engine concurrency cap per replica).
    max_num_seqs: int = 1024
    # Share of activation memory kept per token and layer, in bytes per hidden unit, for
    # training with full recompute (checkpoint at layer inputs) vs without.
    act_bytes_per_hidden_recompute: float = 2.0
    act_bytes_per_hidden_full: float = 34.0
    # Share of device memory reserved by the framework/allocator (CUDA context, NCCL buffers).
    reserve_gb: float = 3.0


DEFAULT = Calibration()
