"""The cost of a forward-only or training pass of one execution unit, term by term (pure).

:func:`pass_cost` adds named terms, each one a function here and a line of docs/perf-model.md
("Forward and training passes"):

* the pass's shape (:func:`pass_shape`): tokens per micro-batch, micro-batches, the passes
  over the weights -- 1 forward, 3 forward + backward, one more with **recompute**
  (:func:`rpeg.perf.units.recomputes` decides it from the activations it would keep);
* **compute** (:func:`gemm_compute`): dense and expert GEMMs at the GPU's size curve and the
  fused attention kernels;
* **memory traffic**: the fp32 log-softmax over the vocabulary (:func:`vocab_traffic_s`) and
  the optimizer update (:func:`optimizer_s`, on the host too where the optimizer lives there);
* **fixed costs** per layer per micro-batch and pass (:func:`layer_overhead_s`,
  :func:`expert_loop_s`);
* the **pipeline bubble** (:func:`bubble`) and the **straggler** of a data-parallel optimizer
  step over packed micro-batches (:func:`straggler`);
* **communication**, by link level (:func:`tensor_parallel_s`, :func:`lora_grad_sum_s`,
  :func:`expert_parallel_s`, :func:`context_parallel_s`, :func:`fsdp_gathers_s` -- overlapped
  with the compute --, :func:`gradient_sync_s`);
* **memory** per device (:func:`state_memory`, :func:`activation_memory`).

The per-plan context is :class:`rpeg.perf.units.UnitContext`; generation:
:mod:`rpeg.perf.generation`; the step: :mod:`rpeg.perf.pricing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rpeg.perf import costs, eager_cpu
from rpeg.perf.lengths import expected_max_normal
from rpeg.perf.lora import adapter_memory, tp_grad_sum_bytes, trainable_params
from rpeg.perf.prediction import GB, StageCost
from rpeg.perf.rank_memory import inflight_chunks, pipeline_chunks
from rpeg.perf.roofline import pass_factor
from rpeg.perf.units import (
    UnitContext,
    full_activation_bytes,
    gathered_extra_gb,
    layer_activation_bytes_per_hidden,
    params_per_device,
    recomputes,
    unit_keeps_gathered,
)
from rpeg.plan.schema import UnitPlan, format_devices
from rpeg.specs import ModelSpec

#: passes over the weights: a forward; forward + backward (the backward twice the forward);
#: the forward once more in the backward where decoder layers are recomputed
FORWARD_PASSES = 1.0
TRAIN_PASSES = 3.0
RECOMPUTE_PASSES = 1.0
#: the backward's half that a frozen weight skips: LoRA (model.lora) trains adapters only, so
#: the base's GEMMs compute input gradients and no weight gradients -- about 2/3 of full
#: fine-tuning's FLOPs per pass (Schulman et al., "LoRA Without Regret", Thinking Machines
#: 2025). Attention holds no weights: its backward is whole either way.
WEIGHT_GRAD_PASSES = 1.0

#: bytes per parameter of an offloaded optimizer step over the host link (fp32 gradients
#: down, bf16 parameters up) and of its CPU Adam in host memory (read master, m, v, gradient;
#: write master, m, v)
HOST_LINK_BYTES_PER_PARAM = 6.0
HOST_ADAM_BYTES_PER_PARAM = 28.0


# --- the shape of a pass -------------------------------------------------------------------
@dataclass(frozen=True)
class PassShape:
    """How one unit's pass is laid out and cut into micro-batches."""

    train: bool
    devices: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int  # devices // (tp * pp * cp)
    cpu: bool  # RPEG's eager CPU workers (rpeg.perf.eager_cpu)
    value_bytes: float  # bytes of a gradient / parameter / activation value on the wire
    tokens_rank: float  # the step's tokens on one data-parallel rank
    tokens_mb: float  # tokens of one micro-batch (packed to the sequence budget)
    # tokens computed over tokens held: 1 where micro-batches are packed; RPEG's CPU workers
    # pad each row to its micro-batch's longest (rpeg.perf.eager_cpu)
    padding: float
    tokens_dev: float  # ... of it on one device (split over cp)
    micro_batches: float  # micro-batches of a rank per step
    per_minibatch: float  # micro-batches per optimizer step (training) or per pass
    in_flight: float  # micro-batches whose activations a rank keeps (a pipeline: its schedule's)
    pp_chunks: int  # model chunks per pipeline rank (2 under interleaved 1F1B, else 1)
    recompute: bool
    # Megatron's sequence parallelism: the activations outside the tensor-parallel GEMMs (the
    # layer inputs a recompute keeps among them) split over the tp ranks
    seq_parallel: bool
    # a critic's or a reward model's pass: a value head (hidden -> 1) where the LM head was,
    # so no vocabulary projection, log-softmax or logits (``SCALAR_HEAD_KINDS``)
    scalar_head: bool
    passes: float  # FORWARD_PASSES, TRAIN_PASSES (+ RECOMPUTE_PASSES)
    # micro-batches packed to a token budget from whole samples (a rank's tokens per step
    # vary with the lengths it drew); False where the runtime's own cut pads fixed rows
    packed: bool


#: stage kinds whose model ends in a value head instead of the LM head: the critic (verl's
#: and OpenRLHF's critics are token-classification models with one label; RPEG's
#: rpeg.runtime.model_io.CriticModel drops the LM head) and a learned reward model's forward
SCALAR_HEAD_KINDS = ("values", "train_critic", "reward")


def pass_shape(c: UnitContext, u: UnitPlan, train: bool, scalar_head: bool = False) -> PassShape:
    """The layout, the micro-batches (on CPU workers the runtime's own, rpeg.perf.eager_cpu)
    and the recompute decision of one pass of ``u``."""
    n = u.num_devices
    tp, pp, cp = u.tp, u.pp, u.cp
    dp = max(1, n // (tp * pp * cp))
    cpu = eager_cpu.is_cpu(c.gpu)
    packed = u.packs(c.model)
    tok_mb = c.max_seq * u.micro_batch_size if packed else (c.P + c.R) * u.micro_batch_size
    tok_rank = c.tokens / dp
    # a micro-batch holds at most one optimizer step's rows: every mini-batch runs at least
    # one micro-batch on each rank (its FSDP gathers, fixed costs and pipeline fill included)
    tok_mb = min(tok_mb, tok_rank / (max(1, c.wl.train_minibatches) if train else 1))
    mb = eager_cpu.micro_batches(c, dp, u.micro_batch_size, train, packed)
    # the runtime's own cut (rpeg.perf.eager_cpu): on CPU workers, and wherever a unit runs
    # padded micro-batches (not packed): each computes its rows at its longest row
    own_cut = cpu or not packed
    tok_mb = mb.tokens if own_cut else tok_mb
    tok_dev = tok_mb / cp
    chunks = pipeline_chunks(u.pp_schedule) if pp > 1 else 1
    steps = max(1, c.wl.train_minibatches) if train else 1
    if own_cut:  # the cut's own count: padded tokens per micro-batch exceed the real ones
        per_minibatch = max(1.0, mb.count / steps)
    else:
        per_minibatch = max(1.0, tok_rank / steps / tok_mb)
    if train:
        # the first pipeline rank's (the most): its schedule's chunk-forwards in flight
        in_flight = inflight_chunks(u.pp_schedule, pp, per_minibatch, 0) / chunks if pp > 1 else 1.0
    else:
        in_flight = 1.0
    seq_par = sequence_parallel(u.engine, tp)
    act_full = full_activation_bytes(c.model, tok_dev, tp, pp, in_flight, c.calib, seq_par)
    # the runtime checkpoints each decoder layer (rpeg.runtime.unit_memory) when the
    # plan says so; ``auto``: when the activations kept without it would crowd the device
    recompute = train and recomputes(u.recompute, act_full / GB, c.gpu.usable_hbm_gb)
    if not train:
        passes = FORWARD_PASSES
    else:
        passes = TRAIN_PASSES + RECOMPUTE_PASSES if recompute else TRAIN_PASSES
    return PassShape(
        train=train,
        devices=n,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=u.ep,
        dp=dp,
        cpu=cpu,
        value_bytes=eager_cpu.comm_value_bytes(c.wl.precision),
        tokens_rank=tok_rank,
        tokens_mb=tok_mb,
        padding=mb.padding if own_cut else 1.0,
        tokens_dev=tok_dev,
        micro_batches=mb.count if own_cut else tok_rank / tok_mb,
        per_minibatch=per_minibatch,
        in_flight=in_flight,
        pp_chunks=chunks,
        recompute=recompute,
        seq_parallel=seq_par,
        scalar_head=scalar_head,
        passes=passes,
        packed=not own_cut,
    )


def pass_flops(c: UnitContext, s: PassShape) -> float:
    """Model FLOPs of the pass (6N/8N per token plus causal attention, and the vision tower
    per pass); what MFU counts, not what is timed."""
    if s.train:
        flops = costs.train_flops(c.model, c.tokens, c.seq_sq, s.recompute)
    else:
        flops = costs.forward_flops(c.model, c.tokens, c.seq_sq)
    return flops + s.passes * c.vision_fwd_flops


# --- compute -------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmCompute:
    """The compute term: seconds of the dense GEMMs, the attention kernels and the expert
    GEMMs, with the efficiencies they ran at."""

    dense_s: float
    attention_s: float
    expert_s: float
    dense_eff: float  # the dense GEMMs' share of the peak (size curve x pass factor)
    expert_eff: float | None  # the expert GEMMs' size-curve efficiency (MoE only)

    @property
    def total_s(self) -> float:
        return self.dense_s + self.attention_s + self.expert_s


def _dense_expert_split(m: ModelSpec) -> tuple[float, float]:
    """(dense matmul params, active expert matmul params) per token."""
    if not m.moe:
        return float(m.matmul_params), 0.0
    expert = m.moe_layers * m.moe.top_k * m.expert_params
    return float(m.matmul_params - expert), float(expert)


def gemm_compute(c: UnitContext, s: PassShape) -> GemmCompute:
    """FLOPs over the devices' peak at the efficiency of the GEMM sizes one micro-batch
    makes (the GPU's size curve) times the pass factor (rpeg.perf.roofline); fused
    attention at ``attn_eff`` where set (flash-attention's backward recomputes the scores:
    ``costs.attn_passes``)."""
    m, gpu, cal = c.model, c.gpu, c.calib
    dense_p, expert_p = _dense_expert_split(m)
    if s.scalar_head:  # the value head's h x 1 for the LM head's h x vocab
        dense_p -= float(m.vocab * m.hidden)
    width = max(m.ffn_hidden if not m.moe else m.attn_width, m.attn_width)
    eff_dense = gpu.matmul_eff(2.0 * s.tokens_dev * m.hidden * width / s.tp)
    factor = pass_factor(cal.train_eff_factor if s.train else cal.forward_eff_factor, gpu)
    peak = c.peak_flops * s.devices
    attn = costs.attn_fwd_flops(m, c.seq_sq) * costs.attn_passes(s.passes, s.train, cal)
    attn *= s.padding  # padded rows attend over their padding too
    weight_passes = s.passes - (WEIGHT_GRAD_PASSES if s.train and c.wl.lora_rank else 0.0)
    dense_flops = weight_passes * 2.0 * dense_p * c.tokens * s.padding
    dense_flops += s.passes * c.vision_fwd_flops
    expert_s, eff_e = 0.0, None
    if expert_p:
        tok_expert = s.tokens_dev * m.moe.top_k / m.moe.experts * s.ep
        eff_e = gpu.matmul_eff(2.0 * tok_expert * m.hidden * m.moe.expert_ffn_hidden)
        expert_s = weight_passes * 2.0 * expert_p * c.tokens * s.padding / (peak * eff_e * factor)
    return GemmCompute(
        dense_s=dense_flops / (peak * eff_dense * factor),
        attention_s=attn / (peak * (cal.attn_eff or eff_dense * factor)),
        expert_s=expert_s,
        dense_eff=eff_dense * factor,
        expert_eff=eff_e,
    )


# --- memory traffic ------------------------------------------------------------------------
def vocab_traffic_s(c: UnitContext, s: PassShape) -> float | None:
    """The fp32 log-softmax over the vocabulary: memory-bound passes over the logits
    (``vocab_passes_fwd`` / ``vocab_passes_train``); None when the calibration prices none."""
    cal, gpu = c.calib, c.gpu
    vpasses = cal.vocab_passes_train if s.train else cal.vocab_passes_fwd
    if not vpasses or s.scalar_head:
        return None
    return (
        c.tokens
        * s.padding
        * c.model.vocab
        * 4.0
        * vpasses
        / (s.devices * gpu.hbm_bytes_per_s * gpu.software_eff)
    )


def host_optimizer_s(c: UnitContext, u: UnitPlan, dp: int) -> float:
    """Seconds of one optimizer step with the optimizer on the host, per device: its shard
    of the trainable parameters (distributed over ``dp``) moved over the host link and
    updated by a CPU Adam."""
    p_dev = params_per_device(c.model, u.tp, u.pp, u.ep)
    p_opt = trainable_params(c.model, c.wl, p_dev, u.tp) / max(1, dp)
    cal = c.calib
    return p_opt * (
        HOST_LINK_BYTES_PER_PARAM / (cal.host_link_gbps * GB)
        + HOST_ADAM_BYTES_PER_PARAM / (cal.host_adam_gbps * GB)
    )


def split_update_share(c: UnitContext, u: UnitPlan, s: PassShape, first: int) -> float:
    """The share of its optimizer update a rank runs: 1/2 for two plain replicas of CPU ranks
    on one host (dp=2, no tp/pp/cp/ep, not FSDP), whose update the runtime splits in halves
    over their pair channel (rpeg.runtime.pair_update: each rank sums, clips and AdamW-updates
    half and they swap weight halves -- the reduce-scatter and all-gather
    :func:`gradient_sync_s` prices); 1 otherwise."""
    plain = (s.dp, s.tp, s.pp, s.cp, s.ep) == (2, 1, 1, 1, 1) and own_replicas(u)
    if plain and eager_cpu.is_cpu(c.gpu) and _dp_link(c, s, first)[0] in ("device", "domain"):
        return 0.5
    return 1.0


def optimizer_s(
    c: UnitContext, u: UnitPlan, s: PassShape, optimizer_gb: float, first: int = 0
) -> float:
    """The optimizer update per step: 16 B read/written per local parameter at HBM speed
    (``optimizer_gb`` holds 12 B of it), once per optimizer step (a split replica pair:
    :func:`split_update_share`); plus the host's step where the optimizer lives on the host.
    0 for a forward pass."""
    if not s.train:
        return 0.0
    t = c.wl.train_minibatches * optimizer_gb * (GB / 12.0 * 16.0 * 2 / c.gpu.hbm_bytes_per_s)
    t *= split_update_share(c, u, s, first)
    if c.wl.assumed_optimizer_on_host:
        t += c.wl.train_minibatches * host_optimizer_s(c, u, s.dp)
    return t


# --- fixed costs and the bubble --------------------------------------------------------------
def layer_overhead_s(c: UnitContext, s: PassShape) -> float:
    """A fixed cost per layer per micro-batch and pass (launch, host sync, MoE routing):
    the device's ``layer_overhead_ms`` where set, else ``layer_overhead_s``."""
    cal, m = c.calib, c.model
    per_layer = costs.layer_launch_s(c.gpu, cal) * m.dense_layers + (
        cal.moe_layer_overhead_s * m.moe_layers
    )
    return s.micro_batches * s.passes * per_layer / s.pp


def expert_loop_s(c: UnitContext, u: UnitPlan, s: PassShape) -> float | None:
    """FSDP trainers run the HF modules, whose MoE block loops over the experts in Python
    (one host sync + ~8 small kernels per expert hit), unlike Megatron's grouped GEMM: a
    fixed cost per expert per MoE layer per micro-batch and pass; under RPEG's expert
    parallelism (rpeg.runtime.expert_parallel) each rank loops over its ``E / ep`` experts
    with the same module. None where it does not apply (dense model, another engine)."""
    m = c.model
    if not (m.moe and u.engine == "fsdp"):
        return None
    experts = m.moe.experts / s.ep
    loop = s.micro_batches * s.passes * c.calib.moe_expert_loop_s * experts * m.moe_layers
    return loop / s.pp


#: seconds per byte of a rank's local expert weights per MoE layer and micro-batch, forward
#: and backward, on an eager CPU worker: transformers' experts (``torch._grouped_mm``'s CPU
#: path) cost in proportion to the experts the rank holds, not to the tokens routed to them
#: (the backward forms every local expert's weight gradient). Measured 2026-12-05 on the
#: 2-core VM, one thread, Qwen3-MoE experts h 256 x 256, 88 assignments, 4 / 8 / 16 experts:
#: fwd+bwd 5.7 / 9.5 / 20.6 ms, forward 2.4 / 2.9 / 3.4 ms per layer: ~1.2 ms per expert of
#: 0.79 MB in fwd+bwd, 0.08 ms in a forward (docs/measurements.md)
CPU_EXPERT_FWD_S_PER_BYTE = 0.08e-3 / 0.79e6
CPU_EXPERT_TRAIN_S_PER_BYTE = 1.2e-3 / 0.79e6


def cpu_expert_weights_s(c: UnitContext, s: PassShape) -> float:
    """On CPU workers: the local experts' weights' cost per MoE layer and micro-batch
    (:data:`CPU_EXPERT_TRAIN_S_PER_BYTE`), ``E / ep`` experts per rank; 0 elsewhere."""
    m = c.model
    if not (s.cpu and m.moe):
        return 0.0
    local = m.moe.experts / s.ep * m.expert_params * 4.0  # fp32 masters on CPU workers
    per = CPU_EXPERT_TRAIN_S_PER_BYTE if s.train else CPU_EXPERT_FWD_S_PER_BYTE
    return s.micro_batches * m.moe_layers / s.pp * local * per


def bubble(s: PassShape) -> float:
    """The pipeline bubble's share of the compute, ``(pp - 1) / (v m)`` (m micro-batches per
    mini-batch, ``v`` model chunks per pipeline rank: 2 under interleaved 1F1B, whose bubble
    is ``pp - 1`` chunk-times of ``1/v`` a stage; Narayanan et al. 2021, arXiv:2104.04473;
    rpeg.runtime.pipeline.bubble_fraction is the same bubble as a share of the step)."""
    return (s.pp - 1) / (s.pp_chunks * s.per_minibatch) if s.pp > 1 else 0.0


def straggler(c: UnitContext, s: PassShape) -> float:
    """The training pass's compute time over its mean rank's: every optimizer step waits for
    the data-parallel rank that drew the most work. A rank's work per step is a sum of ``k``
    independent parts -- the whole samples it packs (verl's dynamic batch size, NeMo-RL's
    sequence packing, Megatron's packed sequences): ``k = samples / (mini-batches x dp)``,
    each one sample's tokens (:meth:`rpeg.perf.lengths.LengthDist.token_spread`); or its
    micro-batches of fixed rows padded to their longest (``k``: micro-batches per step, each
    rows x the longest of them: :meth:`~rpeg.perf.lengths.LengthDist.padded_spread`) -- with
    coefficient of variation ``v``; the largest of ``dp`` such sums is about
    ``1 + v z_dp / sqrt(k)`` times their mean (``z_dp``: the expected largest of ``dp``
    standard normals, :func:`rpeg.perf.lengths.expected_max_normal`). So a trainer loses
    strong scaling as ``dp`` grows at a fixed batch (fewer samples per rank, more ranks to
    wait for). 1 for a forward-only pass (one wait at its end, over all of a rank's samples),
    one data-parallel rank, and RPEG's CPU workers (their passes are priced from the eager
    profile ``rpeg calibrate`` measures on the runtime's own ranks, wait included:
    rpeg.perf.eager_cpu)."""
    if not (s.train and s.dp > 1) or s.cpu:
        return 1.0
    if s.packed:
        k = c.N / (max(1, c.wl.train_minibatches) * s.dp)
        v = c.lengths.token_spread(c.P)
    else:
        k = s.per_minibatch
        rows = s.tokens_mb / (s.padding * (c.P + c.R))
        v = c.lengths.padded_spread(max(1, round(rows)), c.P)
    if k <= 0:
        return 1.0
    return 1.0 + v * expected_max_normal(s.dp) / math.sqrt(max(1.0, k))


def bubble_factor(c: UnitContext, b: float) -> float:
    """The pass's compute time over its busy time, ``1 + bubble``; on CPU workers that share
    cores (rpeg.perf.time_sharing: each at ``cpu_share`` of a core) a pipeline rank's idle
    slots are core time the other workers use, so the pass takes the longer of its own
    schedule and the workers' CPU work: ``max(1, share (1 + b))`` of ``t_comp``, which is
    priced at the shared rate (pp=2 x dp=2 on 2 cores: the bubble hides in the sharing)."""
    share = float(getattr(c, "cpu_share", 1.0))
    return max(1.0, share * (1.0 + b)) if share < 1.0 else 1.0 + b


# --- communication ---------------------------------------------------------------------------
def pipeline_p2p_s(c: UnitContext, s: PassShape, first: int) -> tuple[str, float]:
    """The stage boundaries' point-to-point messages (rpeg.runtime.pipeline: only hidden
    states cross stages): per micro-batch a rank receives and sends one ``[b, T, H]``
    activation forward, and its gradient backward in training -- ``2 (pp - 1) / pp`` messages
    per direction on average over the ranks (the first and last send or receive only), each
    latency plus bytes over the pp link (stride tp x cp): (link level, seconds)."""
    m = c.model
    lvl, bw, alpha = costs.group_link(c.cluster, first, s.pp, s.tp * s.cp)
    nbytes = s.tokens_dev * m.hidden * s.value_bytes / s.tp
    dirs = 2 if s.train else 1
    msgs = s.micro_batches * dirs * 2.0 * (s.pp - 1) / s.pp
    return lvl, msgs * (alpha + nbytes / bw)


def tensor_parallel_s(c: UnitContext, s: PassShape, first: int) -> tuple[str, float]:
    """Two all-reduces (or reduce-scatter + all-gather) of a micro-batch's activations per
    layer per pass: (link level, seconds)."""
    m, cal = c.model, c.calib
    lvl, bw, alpha = costs.group_link(c.cluster, first, s.tp)
    ar = costs.allreduce_time(
        s.tokens_dev * m.hidden * s.value_bytes, s.tp, bw, alpha, cal.nccl_bus_eff
    )
    return lvl, s.micro_batches * s.passes * 2 * m.layers / s.pp * ar


def lora_grad_sum_s(c: UnitContext, s: PassShape, first: int) -> float:
    """LoRA under tensor parallel: the replicated factors' gradients summed over the tp ranks
    once per optimizer step (0 without LoRA)."""
    m, cal = c.model, c.calib
    _, bw, alpha = costs.group_link(c.cluster, first, s.tp)
    g = tp_grad_sum_bytes(m, c.wl, params_per_device(m, s.tp, s.pp, s.ep), s.tp)
    return c.wl.train_minibatches * costs.allreduce_time(g, s.tp, bw, alpha, cal.nccl_bus_eff)


def expert_parallel_s(c: UnitContext, s: PassShape, first: int) -> tuple[str, float]:
    """All-to-all dispatch + combine per MoE layer per pass, waiting for the slowest EP
    group of the pool, plus the dispatch's fixed cost per MoE layer and forward call on the
    device (``GPUSpec.ep_layer_overhead_s``): (link level, seconds)."""
    m = c.model
    tp, cp, ep, n = s.tp, s.cp, s.ep, s.devices
    # with tensor parallel, sequence parallel splits the tokens over the tp ranks first
    a2a_bytes = s.tokens_dev / tp * m.moe.top_k * m.hidden * 2.0
    # the EP groups tile the pool in blocks of ep*tp*cp devices; every group waits for
    # the slowest one (a block straddling a scale-up domain boundary)
    block = ep * tp * cp
    ta, lvl = 0.0, "device"
    dom, rack = c.cluster.domain_size, c.cluster.rack_size
    span = (ep - 1) * tp * cp
    seen: set[tuple[int, bool]] = set()
    for b0 in range(first, first + max(block, n - block + 1), block):
        # blocks at the same offset in their domain that cross (or not) a rack boundary
        # cost the same: price each kind once
        key = (b0 % dom, b0 // rack != (b0 + span) // rack)
        if key in seen:
            continue
        seen.add(key)
        t_b, l_b = costs.alltoall_time(a2a_bytes, ep, c.cluster, b0, tp * cp, c.calib.nccl_bus_eff)
        if t_b > ta:
            ta, lvl = t_b, l_b
    # the dispatch's fixed cost per MoE layer and forward call (GPUSpec.ep_layer_overhead_s);
    # a backward pays half of it (two of the four all-to-alls)
    calls = (1.0 + (1.0 if s.recompute else 0.0) + 0.5) if s.train else 1.0
    fixed = s.micro_batches * calls * m.moe_layers / s.pp * c.gpu.ep_layer_overhead_s
    return lvl, s.micro_batches * s.passes * 2 * m.moe_layers / s.pp * ta + fixed


def collective_latency(c: UnitContext, alpha: float) -> float:
    """The latency of one collective call that the runtime issues from Python inside a pass
    (context parallelism's key/value gathers and log-prob sums, the per-tensor gradient sums
    of cp and of pipelined dp replicas): the cluster's measured ``collective_latency_s`` where
    its catalog states one (gloo on CPU workers wakes its threads after the rank's compute:
    ~0.7 ms against a link latency of 0.15 ms, benchmarks/bench_collectives.py), never below
    the link's latency ``alpha``; the link's latency elsewhere (NCCL)."""
    lat = c.cluster.collective_latency_s
    return alpha if lat is None else max(alpha, lat)


def param_tensors(m: ModelSpec, pp: int) -> float:
    """Parameter tensors one pipeline rank holds (the HF layout's, split over ``pp`` stages):
    the number of gradient collectives a runtime that sums them one tensor at a time issues."""
    return max(1.0, m.hf_tensors / max(1, pp))


def own_replicas(u: UnitPlan) -> bool:
    """Whether the unit's pp/cp ranks are RPEG's own (rpeg.runtime.pipeline,
    rpeg.runtime.context_parallel: dp replicas, collectives issued from Python one tensor at a
    time) rather than an engine that buckets them (Megatron, FSDP -- RPEG's FSDP at cp shards
    over the dp x cp ranks and sums the gradients in its reduce-scatter, as FSDP with Ulysses
    in the published systems does)."""
    return u.engine not in SHARDED_OPTIMIZER_ENGINES


def context_parallel_s(
    c: UnitContext, s: PassShape, first: int, own: bool = False
) -> tuple[str, float]:
    """The K/V exchange of the full-attention layers (rpeg.runtime.context_parallel): per
    layer and forward two all-gathers (keys, values), per backward two all-reduces of their
    gathered gradients (twice the bytes: the backward counts as two passes), each call at
    :func:`collective_latency`; with RPEG's own ranks (``own``, :func:`own_replicas`) also
    per micro-batch the log-probs' sum over cp (and the entropies' in training): (link
    level, seconds)."""
    m, cal = c.model, c.calib
    lvl, bw, alpha = costs.group_link(c.cluster, first, s.cp, s.tp)
    lat_c = collective_latency(c, alpha)
    full = max(1, m.full_attn_layers)  # linear-attention layers exchange no K/V
    kvb = s.tokens_dev * m.kv_bytes_per_token(2.0) / full * (s.cp - 1)
    # per layer and pass two collectives (keys, values), each (cp - 1) latencies
    lat = 2 * lat_c * (s.cp - 1)
    kv = s.micro_batches * s.passes * full / s.pp * (kvb / (bw * cal.nccl_bus_eff) + lat)
    # the [b, R] fp32 log-probs (training: and entropies) summed over cp per micro-batch
    resp = s.tokens_mb * c.R / max(1e-9, c.P + c.R) * 4.0
    sums = (2 if s.train else 1) * s.micro_batches / s.pp if own else 0.0
    return lvl, kv + sums * costs.allreduce_time(resp, s.cp, bw, lat_c, cal.nccl_bus_eff)


def context_grad_sum_s(
    c: UnitContext, s: PassShape, first: int, weights_gb: float, own: bool = False
) -> tuple[str, float]:
    """Context parallelism: each cp rank holds its positions' share of every gradient, summed
    over the cp group once per optimizer step (an all-reduce: reduce-scatter + all-gather);
    RPEG's own ranks (``own``: rpeg.runtime.context_parallel.ContextShards) sum one parameter
    tensor at a time (:func:`param_tensors` calls, each at :func:`collective_latency`):
    (link level, seconds)."""
    lvl, bw, lat = costs.group_link(c.cluster, first, s.cp, s.tp)
    g_bytes = weights_gb * GB / c.wbytes * s.value_bytes
    eff = c.calib.nccl_bus_eff
    if not own:
        return lvl, 2 * costs.gather_time(g_bytes, s.cp, bw, lat, eff) * c.wl.train_minibatches
    per_step = costs.allreduce_time(g_bytes, s.cp, bw, 0.0, eff) + param_tensors(
        c.model, s.pp
    ) * costs.allreduce_time(1.0, s.cp, float("inf"), collective_latency(c, lat), eff)
    return lvl, per_step * c.wl.train_minibatches


def replica_tensor_sums_s(c: UnitContext, s: PassShape, first: int) -> float:
    """Pipelined or context-parallel trainers average the gradients over their dp replicas
    one parameter tensor at a time (rpeg.runtime.pipeline.Pipeline.grad_norm_and_clip,
    ContextShards.sync_grads), not in the buckets of the plain replicas that
    :func:`gradient_sync_s` prices: the latencies of the calls beyond those two, per
    optimizer step (0 elsewhere)."""
    if not (s.train and s.dp > 1 and (s.pp > 1 or s.cp > 1)):
        return 0.0
    _, _, alpha = _dp_link(c, s, first)
    calls = param_tensors(c.model, s.pp)
    eff = c.calib.nccl_bus_eff
    per_call = costs.allreduce_time(1.0, s.dp, float("inf"), collective_latency(c, alpha), eff)
    bucketed = 2 * costs.gather_time(1.0, s.dp, float("inf"), alpha, eff)
    return c.wl.train_minibatches * max(0.0, calls * per_call - bucketed)


def pipeline_rank_sync_s(c: UnitContext, s: PassShape, first: int) -> tuple[str, float]:
    """The pipeline group's own collectives besides the stage boundaries' messages
    (rpeg.runtime.pipeline): per optimizer step the gradient norm's all-reduce over the pp
    ranks and the last stage's metrics broadcast (an object: its size, then its bytes); per
    forward pass the last stage's ``[B, R]`` log-probs broadcast to the group: (link level,
    seconds)."""
    lvl, bw, alpha = costs.group_link(c.cluster, first, s.pp, s.tp * s.cp)
    lat = collective_latency(c, alpha)
    eff = c.calib.nccl_bus_eff
    if s.train:
        per_step = costs.allreduce_time(8.0, s.pp, bw, lat, eff) + 2 * costs.gather_time(
            1.0, s.pp, bw, lat, eff
        )
        return lvl, c.wl.train_minibatches * per_step
    rows = s.tokens_rank / max(1e-9, c.P + c.R)
    return lvl, costs.gather_time(rows * c.R * 4.0 * s.pp, s.pp, bw, lat, eff)


def _dp_link(c: UnitContext, s: PassShape, first: int) -> tuple[str, float, float]:
    lvl = c.cluster.span_level_contiguous(first, s.devices)
    link = c.cluster.link(lvl)
    return lvl, link.bytes_per_s, link.latency_s


def gradient_sync_s(
    c: UnitContext, s: PassShape, first: int, weights_gb: float
) -> tuple[str, float]:
    """Data parallel: reduce-scatter of the gradients and all-gather of the parameters per
    optimizer step (``weights_gb``: the rank's weights as held): (link level, seconds)."""
    lvl, bw, lat = _dp_link(c, s, first)
    p_bytes = weights_gb * GB / c.wbytes * s.value_bytes
    per_step = 2 * costs.gather_time(p_bytes, s.dp, bw, lat, c.calib.nccl_bus_eff)
    return lvl, per_step * c.wl.train_minibatches


def fsdp_collectives(gathered: bool) -> int:
    """FSDP collectives per training micro-batch: the forward's all-gather, the backward's
    again unless the parameters stay gathered, and the gradients' reduce-scatter."""
    return 2 if gathered else 3


def fsdp_gathers_s(
    c: UnitContext, s: PassShape, first: int, weights_gb: float, gathered: bool
) -> tuple[str, float]:
    """FSDP's per-micro-batch collectives of the parameters (and, training, the gradients):
    (link level, seconds per step); overlapped with the compute (``eager_cpu.overlap``)."""
    lvl, bw, lat = _dp_link(c, s, first)
    eff = c.calib.nccl_bus_eff
    if s.train:
        p_bytes = weights_gb * GB / c.wbytes * s.value_bytes
        fs = (
            s.micro_batches
            / max(1, c.wl.train_minibatches)
            * fsdp_collectives(gathered)
            * costs.gather_time(p_bytes * s.dp, s.dp, bw, lat, eff)
        )
        return lvl, fs * c.wl.train_minibatches
    p_bytes = (c.model.params - ep_experts(c.model, s.ep, "fsdp")) * s.value_bytes / (s.tp * s.pp)
    return lvl, s.micro_batches * costs.gather_time(p_bytes, s.dp, bw, lat, eff)


def ep_experts(m: ModelSpec, ep: int, engine: str) -> float:
    """Expert parameters (all of the model's) that RPEG's FSDP trainer leaves out of FSDP at
    ``ep > 1``: each rank holds its ``1 / ep`` of them whole, replicated over the ``dp / ep``
    ranks that hold the same experts (rpeg.runtime.expert_parallel); 0 otherwise (another
    engine: Megatron shards experts its own way)."""
    if ep <= 1 or engine != "fsdp" or not m.moe:
        return 0.0
    return float(m.routed_expert_params)


def expert_grad_sync_s(c: UnitContext, s: PassShape, first: int, u: UnitPlan) -> float:
    """RPEG's ep: the local experts' gradients summed over the ``dp / ep`` ranks holding the
    same experts, once per optimizer step (0 when ``dp == ep``)."""
    split = ep_experts(c.model, s.ep, u.engine) / (s.ep * s.pp)
    edp = s.dp // max(1, s.ep)
    if not split or edp <= 1:
        return 0.0
    _, bw, lat = _dp_link(c, s, first)
    grad = split * 4.0  # fp32 gradients of the masters
    return c.wl.train_minibatches * costs.allreduce_time(grad, edp, bw, lat, c.calib.nccl_bus_eff)


# --- memory ----------------------------------------------------------------------------------
#: training engines whose AdamW state is split over the data-parallel ranks (FSDP2/ZeRO-3,
#: Megatron's distributed optimizer); the others' replicas each hold all of it
SHARDED_OPTIMIZER_ENGINES = ("fsdp", "megatron")


def state_memory(c: UnitContext, u: UnitPlan, trainable: bool) -> dict[str, float]:
    """GB per device of the unit's weights and, trained, its gradients, optimizer state
    (fp32 master + Adam m, v: distributed over dp by FSDP and Megatron, whole on a replica),
    LoRA adapters and the weights an FSDP pass keeps gathered."""
    p_dev = params_per_device(c.model, u.tp, u.pp, u.ep)
    fsdp = u.engine == "fsdp"
    dp = max(1, u.num_devices // (u.tp * u.pp))
    # RPEG's ep: the rank's experts stay whole beside FSDP's shard of the rest (ep_experts)
    split = ep_experts(c.model, u.ep, u.engine) / (u.ep * u.pp)
    p_shard = (p_dev - split) / (dp if fsdp else 1) + split  # the parameters a rank holds
    out = {"weights": p_shard * c.wbytes / GB}
    if trainable:
        p_train = trainable_params(c.model, c.wl, p_dev, u.tp)  # LoRA: adapters (perf.lora)
        out |= adapter_memory(c.model, c.wl, p_dev, c.wbytes, dp if fsdp else 1, u.tp)
        out["gradients"] = p_train * 2.0 / GB / (dp if fsdp else 1)
        # fp32 master + Adam m, v: sharded over dp by FSDP and Megatron's distributed
        # optimizer; whole on each of RPEG's data-parallel replicas (engine auto/torch)
        out["optimizer"] = (
            p_train * 12.0 / (dp if u.engine in SHARDED_OPTIMIZER_ENGINES else 1) / GB
        )
        if split:  # the whole local experts' gradients and AdamW state, over the rest's shard
            out["gradients"] = ((p_train - split) / dp + split) * 2.0 / GB
            out["optimizer"] = ((p_train - split) / dp + split) * 12.0 / GB
        if c.wl.assumed_optimizer_on_host:
            out["optimizer"] = 0.0  # on the host (priced in optimizer_s: host_optimizer_s)
        if unit_keeps_gathered(c, u):
            out["gathered_weights"] = gathered_extra_gb(p_dev, c.wbytes, dp)
    return out


#: trainers that run Megatron's sequence parallelism wherever tp > 1: Megatron-style engines
#: of published systems (Megatron-LM ``--sequence-parallel``, Megatron-Bridge recipes, verl's
#: ``megatron.sequence_parallel`` default, slime's scripts). RPEG's own tensor parallelism
#: (rpeg.runtime.tensor_parallel) keeps the layer inputs whole on every tp rank.
SEQUENCE_PARALLEL_ENGINES = ("megatron",)


def sequence_parallel(engine: str, tp: int) -> bool:
    """Whether a training pass of ``engine`` at ``tp`` splits its layer inputs over tp."""
    return tp > 1 and engine in SEQUENCE_PARALLEL_ENGINES


def activation_memory(c: UnitContext, s: PassShape) -> tuple[float, float]:
    """(activations, logits) in bytes per device: training keeps every layer's activations
    of the micro-batches in flight, or with recompute each layer's input (split over tp
    under sequence parallelism, else whole on every tp rank) plus one layer's full set; the
    fp32 logits of one chunk (and their gradient in training)."""
    m, cal = c.model, c.calib
    if s.train:
        layer = layer_activation_bytes_per_hidden(cal, s.tp, s.seq_parallel)
        per = (
            cal.act_bytes_per_hidden_recompute / (s.tp if s.seq_parallel else 1)
            if s.recompute
            else layer
        )
        act = s.tokens_dev * m.hidden * per * (m.layers / s.pp) * s.in_flight
        if s.recompute:
            act += s.tokens_dev * m.hidden * layer
    else:
        act = s.tokens_dev * m.hidden * 2.0 * 4
    logits = (
        min(s.tokens_dev, cal.logits_chunk_tokens) * m.vocab / s.tp * 4.0 * (2 if s.train else 1)
    )
    if s.scalar_head:  # one value per token
        logits = 0.0
    return act, logits


# --- the pass ----------------------------------------------------------------------------------
def _add(comm: dict[str, float], level: str, seconds: float) -> None:
    comm[level] = comm.get(level, 0.0) + seconds


def pass_cost(c: UnitContext, u: UnitPlan, name: str, kind: str, train: bool) -> StageCost:
    """One forward-only or training pass of ``u``: time, FLOPs, communication by link level,
    memory per device, and each term in ``detail`` (module docstring)."""
    s = pass_shape(c, u, train, scalar_head=kind in SCALAR_HEAD_KINDS)
    sc = StageCost(name, (kind,), format_devices(u.devices), s.devices)
    sc.detail["recompute"] = float(s.recompute)
    # compute, then memory traffic and fixed costs on the same clock
    g = gemm_compute(c, s)
    sc.detail["attn_s"] = g.attention_s
    if g.expert_eff is not None:
        sc.detail["expert_gemm_eff"] = g.expert_eff
    t_comp = g.total_s
    vocab = vocab_traffic_s(c, s)
    if vocab is not None:
        t_comp += vocab
        sc.detail["vocab_s"] = vocab
    t_comp += layer_overhead_s(c, s)
    loop = expert_loop_s(c, u, s)
    if loop is not None:
        t_comp += loop
        sc.detail["moe_expert_loop_s"] = loop
    ew = cpu_expert_weights_s(c, s)
    if ew:
        t_comp += ew
        sc.detail["cpu_expert_weights_s"] = ew
    # communication, by link level
    comm: dict[str, float] = {}
    first = u.devices[0]
    if s.tp > 1:
        _add(comm, *tensor_parallel_s(c, s, first))
        if train:
            lvl = costs.group_link(c.cluster, first, s.tp)[0]
            lora = lora_grad_sum_s(c, s, first)
            if lora:
                comm[lvl] += lora
                sc.detail["lora_tp_grad_sum_s"] = lora
    if c.model.moe and s.ep > 1:
        _add(comm, *expert_parallel_s(c, s, first))
    own = own_replicas(u)
    if s.cp > 1:
        _add(comm, *context_parallel_s(c, s, first, own))
    if s.pp > 1:
        _add(comm, *pipeline_p2p_s(c, s, first))
        if own:
            _add(comm, *pipeline_rank_sync_s(c, s, first))
    state = state_memory(c, u, train)
    # FSDP shards over the dp x cp ranks (the cp ranks hold the same parameters:
    # rpeg.runtime.context_parallel.context_fsdp; state_memory's dp counts them): its gathers
    # and gradient reduction run over that group, which also sums the gradients over cp
    fsdp = u.engine == "fsdp"
    fs_shape = replace(s, dp=s.dp * s.cp) if fsdp else s
    if fsdp and fs_shape.dp > 1:
        gathered = "gathered_weights" in state
        if train:
            sc.detail["fsdp_collectives_per_micro_batch"] = float(fsdp_collectives(gathered))
        split_gb = ep_experts(c.model, s.ep, u.engine) / (s.ep * s.pp) * c.wbytes / GB
        lvl, fs = fsdp_gathers_s(c, fs_shape, first, state["weights"] - split_gb, gathered)
        t_comp = eager_cpu.overlap(c.gpu, t_comp, fs, comm, lvl)
    if train and fs_shape.dp > 1:
        split_gb = ep_experts(c.model, s.ep, u.engine) / (s.ep * s.pp) * c.wbytes / GB
        _add(comm, *gradient_sync_s(c, fs_shape, first, state["weights"] - split_gb))
        per_tensor = replica_tensor_sums_s(c, s, first) if own and s.dp > 1 else 0.0
        if per_tensor:
            _add(comm, _dp_link(c, s, first)[0], per_tensor)
            sc.detail["replica_tensor_sums_s"] = per_tensor
        ex = expert_grad_sync_s(c, s, first, u) if s.dp > 1 else 0.0
        if ex:
            _add(comm, _dp_link(c, s, first)[0], ex)
            sc.detail["ep_expert_grad_sync_s"] = ex
    if train and s.cp > 1 and not fsdp:  # every gradient summed over cp once per update
        _add(comm, *context_grad_sum_s(c, s, first, state["weights"], own))
    t_opt = optimizer_s(c, u, s, state.get("optimizer", 0.0), first)
    b = bubble(s)
    scale = c.calib.train_eff_scale if train else c.calib.fwd_eff_scale
    strag = straggler(c, s)
    t_pipe = t_comp * bubble_factor(c, b) * strag
    sc.time_s = eager_cpu.scaled(c.gpu, t_pipe + t_opt, sum(comm.values()), scale)
    sc.flops = pass_flops(c, s)
    sc.comm_s = comm
    act, logits = activation_memory(c, s)
    sc.memory_gb = {
        **state,
        "activations": act / GB,
        "logits": logits / GB,
        "framework": c.calib.reserve_gb,
    }
    sc.detail.update(
        mfu_gemm_dense=g.dense_eff,
        bubble=b,
        straggler=strag,
        micro_batches=s.micro_batches,
        compute_s=t_comp,
        optimizer_s=t_opt,
    )
    return sc
