"""The few named calibration constants of the performance model (all documented in
docs/calibration.md). They are physical efficiencies and overheads, shared by every plan; none
is fitted per validation row.

The package also refits them from a user's measured run (``rpeg calibrate``): :mod:`.fit`
(efficiency scales and fixed costs, written to the user's ``calibration.yaml``, read back
here), :mod:`.run_lengths` and :mod:`.turn_fit` / :mod:`.turn_store` (the lengths and turn
shape a run measured, kept for later predictions of the same model and task). This module
imports none of them: the model reads the constants without the fitting."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Calibration:
    # Decode is memory-bound: achieved share of peak HBM bandwidth when streaming weights and
    # KV (vLLM paged attention + CUDA graphs reach ~70-80% on H100).
    decode_hbm_eff: float = 0.75
    # Paged-attention KV reads in decode (gathered pages, per-sequence tiles): achieved share
    # of HBM bandwidth; 0 = same as decode_hbm_eff.
    kv_hbm_eff: float = 0.0
    # MoE decode: achieved share of HBM bandwidth when streaming routed-expert weights
    # (vLLM fused-MoE Triton kernels at 1-8 tokens per expert: ~60%, below dense GEMV's ~75%
    # because each expert is a separate small tile loop).
    moe_expert_hbm_eff: float = 0.6
    # Fixed engine time per decode step (scheduler, sampling, detokenisation, launch) in s.
    decode_step_overhead_s: float = 0.004
    # Engine host time per live sequence per decode step (scheduler bookkeeping, sampler
    # and detokeniser per request), s. docs/calibration.md, "Calibration constants".
    decode_seq_overhead_s: float = 1e-5
    # Non-GEMM share of a training/forward micro-batch: achieved MFU = GEMM efficiency (size
    # curve of the GPU) x this factor (attention kernels, norms, optimizer, packing, launch).
    train_eff_factor: float = 0.70
    # fp8 GEMMs (Transformer Engine / vLLM fp8): achieved share of the fp8 peak relative to
    # what bf16 GEMMs of the same size reach of theirs (per-tensor scaling, casts, amax
    # reductions); 0.7 x 2 = 1.4x bf16. docs/perf-model.md, "Equations" (prefill).
    fp8_gemm_eff: float = 0.7
    # Extra factor for forward-only passes (logprobs): short kernels, no overlap of comm.
    forward_eff_factor: float = 0.60
    # Fixed time per layer per micro-batch per pass in training/forward (kernel launches,
    # host syncs). MoE layers pay more: dropless token-count sync, permute/unpermute, a2a
    # latency (Megatron-Core MoE).
    layer_overhead_s: float = 0.0002
    moe_layer_overhead_s: float = 0.003
    # MoE training without expert parallelism on an FSDP trainer (HF modules: a Python loop
    # over the experts, each a host sync for its token index plus ~8 small kernels forward,
    # at ~5-10 us a launch and ~30 us a sync): per expert per MoE layer per micro-batch per
    # pass, s. Megatron-Core's grouped GEMM (and any EP layout) does not pay it.
    moe_expert_loop_s: float = 0.0001
    # Weight refit trainer -> rollout engine on a GPU stack: seconds per GB of the model's
    # weights in the HF layout (bf16), paid once per refit. verl and NeMo-RL export full
    # (unsharded) HF tensors -- the trainer gathers its TP/EP/FSDP shards -- and every engine
    # rank's vLLM ``load_weights`` receives each whole tensor and narrows it to its shard, so
    # the hand-off moves the whole model whatever the engine's TP. Basis: every DeepSeek-V3
    # row (128-512 GPUs, H100 and GB200, colocated and 1-off) carries ~55-60 s per step
    # beyond compute for 1,342 GB of bf16 weights, independent of GPU count and type: 1/23
    # GB/s. A cluster that measured its own per-tensor cost (``runtime.refit_tensor_ms``,
    # rpeg's CPU runtime) is priced by that instead. docs/perf-model.md, "Weight sync".
    refit_s_per_gb: float = 1.0 / 23.0
    # Flash-attention backward / forward cost ratio (hardware FLOPs): the backward recomputes
    # the s^2 scores and runs 5 s^2-sized matmuls against 2 in the forward (FlashAttention-2,
    # Dao 2023). A kernel fact, not fitted: matters at long context (9-30k tokens).
    attn_bwd_fwd_ratio: float = 2.5
    # Achieved share of the bf16 peak by fused (flash) attention in training/forward passes,
    # averaged over forward and backward; 0 = use the GEMM efficiency x the pass factor.
    attn_eff: float = 0.0
    # NCCL achieved bus bandwidth / link peak for large messages.
    nccl_bus_eff: float = 0.70
    # Effective host<->device copy bandwidth (PCIe gen5 x16 in practice), GB/s, for offload.
    host_link_gbps: float = 25.0
    # Host memory traffic of a CPU Adam (optimizer offload) per GPU it serves, GB/s: the
    # update reads fp32 master, m, v and gradient and writes master, m, v (28 B/parameter);
    # a socket's ~200 GB/s over 8 GPUs. docs/perf-model.md, "Equations" (memory).
    host_adam_gbps: float = 25.0
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
    # Response-length prior where a workload does not state its mean: the untruncated length
    # is lognormal(median of the model's kind, length_sigma), clamped at the cap
    # (rpeg.perf.lengths.prior_mean). Reasoning models (R1-distilled, Qwen3 thinking) vs
    # base/instruct models; sources in docs/perf-model.md, "Response-length prior".
    response_median_reasoning: float = 4762.0  # at a 4,096-token cap (below)
    response_median_instruct: float = 700.0
    # A reasoning model's natural length on code-generation prompts relative to math prompts
    # (the reasoning median's multiplier where a workload says its task is code): the same
    # model, the same evaluator, no length limit that binds -- AceReason-Nemotron-14B (RL from
    # R1-Distill-Qwen-14B) 16,669 tokens on LiveCodeBench v5 vs 13,833 on AIME24 (Elastic
    # Reasoning, arXiv 2505.05315, the E1-AceReason-14B model card). docs/perf-model.md,
    # "Response-length prior".
    response_scale_code: float = 1.2
    # A reasoning model's median grows with the budget it runs under: (cap / 4,096) **
    # reasoning_cap_exponent times ``response_median_reasoning`` (the median at a 4,096 cap).
    # Both set on the published mean lengths of the shipped reasoning rows, not on step
    # times: NeMo-RL Qwen3-30B/32B at a 3,994 cap 3,154-3,258 (3,205), Qwen3-235B at 8,074
    # 5,671-5,721 (5,705) -- medians 4,704 and 6,608 under the lognormal clamp, so exponent
    # ln(6608/4704) / ln(8074/3994) = 0.483 and 4,762 at 4,096. Thinking traces fill what a
    # longer budget allows (DeepScaleR's 8k -> 16k -> 24k context stages lengthened its
    # responses); an instruct answer ends on its own: no exponent (docs/perf-model.md,
    # "Response-length prior").
    reasoning_cap_exponent: float = 0.483
    reasoning_cap_ref: float = 4096.0
    # Host work per sample on the step's critical path (reward scoring, detokenisation,
    # batch marshalling in the driver), s. See docs/calibration.md, "Calibration constants".
    host_per_sample_s: float = 0.002
    # fp32 vocabulary passes per token of the log-prob computation (memory-bound, not in the
    # GEMM FLOPs): forward writes the logits and reads them for the log-sum-exp and the
    # gather; training adds the backward's read and gradient write.
    vocab_passes_fwd: float = 3.0
    vocab_passes_train: float = 6.0
    # Speculative decoding: the share of draft tokens the target accepts, each given the
    # previous one accepted (DeepSeek-V3's MTP head: 85-90% for its one draft token; EAGLE
    # heads on RL prompts at rollout batch sizes lower), where a run does not publish its
    # acceptance length: mean tokens per step = 1 + r + ... + r^k for k drafts.
    spec_accept_rate: float = 0.8
    # Host and launch time of one speculative draft pass (vLLM proposes each draft position
    # with a forward of its own: inputs, graph replay, the vocabulary's argmax), s. Set on
    # NeMo-RL's speculative rollouts (Iso et al. 2026, arXiv 2604.26779: Qwen3-8B GRPO on 32
    # GB200, EAGLE-3, k = 3 / 5 / 7 drafts: rollout 1.77 / 1.44 / 1.21x on RL-Zero and 1.53 /
    # 0.84 / 0.71x on RL-Think; a 64 x 16 rollout at an 8,192 cap there is priced 1.52 / 1.44 /
    # 1.31x at this value, 2.7 / 3.2 / 3.5x with a draft pass at one layer's share of a step,
    # as before). docs/calibration.md, "Calibration constants".
    draft_pass_overhead_s: float = 0.002
    # Interval bounds (rpeg.perf.interval): relative uncertainty of each term's efficiency,
    # factor on the fixed costs, and the spread (ratio) of the response-length prior's
    # median. docs/validation.md, "Intervals".
    decode_uncertainty: float = 0.2
    compute_uncertainty: float = 0.2
    comm_uncertainty: float = 0.25
    fixed_cost_factor: float = 1.4
    length_prior_spread: float = 1.5
    # Fitted on a measured run of this machine (``rpeg calibrate runs/<run>``, rpeg.perf.calibration.fit):
    # achieved share of the modelled rate per unit class (time = modelled time / scale) and
    # the measured per-step overhead (overrides the cluster's ``runtime.step_overhead_s``).
    gen_eff_scale: float = 1.0
    train_eff_scale: float = 1.0
    fwd_eff_scale: float = 1.0
    fitted_step_overhead_s: float | None = None
    # and the measured host work per sample of its rule-reward units (overrides the cluster's
    # ``runtime.host_per_sample_ms`` and ``host_per_sample_s``)
    fitted_host_per_sample_s: float | None = None
    # and the latency of one collective call the runtime issues from Python inside a pass, as
    # benchmarks/bench_collectives.py measures it on this machine (``rpeg calibrate
    # --collective-ms``; overrides the cluster's ``runtime.collective_latency_ms``: gloo on this
    # 2-core VM 1.04 ms against the catalog's 0.7 ms)
    fitted_collective_latency_s: float | None = None
    # vLLM V1 default max_num_seqs on >= 70 GB GPUs (engine concurrency cap per replica).
    max_num_seqs: int = 1024
    # Share of activation memory kept per token and layer, in bytes per hidden unit, for
    # training with full recompute (checkpoint at layer inputs) vs without.
    act_bytes_per_hidden_recompute: float = 2.0
    act_bytes_per_hidden_full: float = 34.0
    # ... of which outside the tensor-parallel GEMM regions (the layer norms' inputs, the
    # dropout masks: 10 of Korthikanti et al. 2022's 34 sbh): whole on every tp rank unless
    # sequence parallelism splits them (Megatron-style trainers; rpeg.perf.passes)
    act_bytes_per_hidden_replicated: float = 10.0
    # Share of device memory reserved by the framework/allocator (CUDA context, NCCL buffers).
    reserve_gb: float = 3.0
    # The fp32 logits of a pass are held for at most this many tokens of a device's
    # micro-batch: long-sequence RL trainers compute the vocabulary projection and log-softmax
    # in sequence chunks (fused linear-cross-entropy kernels, chunked log-prob), else a 32k
    # sequence of a 248k-vocabulary model would hold 65 GB of logits. Memory only.
    logits_chunk_tokens: float = 8192.0


DEFAULT = Calibration()
# The shipped constants as such (published-run validation): never replaced by a machine's
# fitted calibration, unlike ``DEFAULT`` (see ``machine_calibration``).
SHIPPED = Calibration()

CALIBRATION_FILE = "calibration.yaml"


def user_calibration_file() -> Path:
    import os

    return _user_file_for(os.environ.get("RPEG_SPECS_DIR", ""))


@lru_cache(maxsize=8)
def _user_file_for(env: str) -> Path:
    from rpeg.specs import user_specs_dir

    return user_specs_dir() / CALIBRATION_FILE


@lru_cache(maxsize=8)
def _read(path: str, mtime: float) -> dict[str, dict[str, Any]]:
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    clusters = data.get("clusters", {}) if isinstance(data, dict) else {}
    return clusters if isinstance(clusters, dict) else {}


_FITTED = (
    "gen_eff_scale",
    "train_eff_scale",
    "fwd_eff_scale",
    "fitted_step_overhead_s",
    "fitted_host_per_sample_s",
    "fitted_collective_latency_s",
)


def machine_calibration(cluster: str, base: Calibration = DEFAULT) -> Calibration:
    """``base`` with the values fitted on a measured run of ``cluster`` (the user's
    ``calibration.yaml``, written by ``rpeg calibrate``); ``base`` itself when none."""
    path = user_calibration_file()
    if not path.is_file():
        return base
    entry = _read(str(path), path.stat().st_mtime).get(cluster)
    if not isinstance(entry, dict):
        return base
    kw = {k: float(entry[k]) for k in _FITTED if isinstance(entry.get(k), (int, float))}
    return replace(base, **kw) if kw else base


def resolve(calib: Calibration, cluster: str) -> Calibration:
    """The calibration a prediction uses: ``DEFAULT`` (the default argument) means "this
    machine's" (fitted values where ``rpeg calibrate`` wrote some); any other instance,
    ``SHIPPED`` included, is used as given."""
    return machine_calibration(cluster) if calib is DEFAULT else calib
