"""The per-plan context every unit's cost shares, and the cost of forward-only and training
passes (pure). Generation and weight sync: :mod:`rpeg.perf.generation`; the step assembly:
:mod:`rpeg.perf.pricing`; every equation is in docs/perf-model.md."""

from __future__ import annotations

from typing import Any

from rpeg.perf import costs, eager_cpu, turns
from rpeg.perf.calibration import Calibration
from rpeg.perf.lengths import LengthDist, prior_mean
from rpeg.perf.lora import adapter_memory, tp_grad_sum_bytes, trainable_params
from rpeg.perf.prediction import GB, StageCost, Workload
from rpeg.perf.roofline import pass_factor
from rpeg.plan.schema import InfeasiblePlan, Plan, UnitPlan, format_devices
from rpeg.specs import ClusterSpec, ModelSpec

# --- helpers ----------------------------------------------------------------------------
GEN_KIND = "generate"
FWD_KINDS = ("ref_logprob", "old_logprob", "values")
TRAIN_KINDS = ("train_actor", "train_critic")


def _kind(stage: Any) -> str:
    k = stage.kind
    return getattr(k, "value", str(k))


def graph_units(graph: Any) -> list[tuple[str, tuple[tuple[str, str, str], ...]]]:
    """[(unit name, ((stage name, kind, role), ...))] in execution order (duck-typed IR)."""
    by_name = {s.name: s for s in graph.stages}
    out = []
    for u in graph.execution_units():
        members = getattr(u, "stages", None)
        if members is None:
            members = (u,)
        else:
            members = tuple(by_name[m] if isinstance(m, str) else m for m in members)
        out.append(
            (
                u.name,
                tuple(
                    (
                        s.name,
                        _kind(s),
                        getattr(getattr(s, "role", None), "value", str(getattr(s, "role", ""))),
                    )
                    for s in members
                ),
            )
        )
    return out


_GRAPH_INFO: dict[int, tuple[Any, dict[str, Any]]] = {}


def graph_info(graph: Any) -> dict[str, Any]:
    """Per graph (cached by identity): units, cross-unit input fields, streaming units."""
    hit = _GRAPH_INFO.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    units = graph_units(graph)
    unit_of = {sname: uname for uname, members in units for sname, _, _ in members}
    inputs: dict[str, list[tuple[str, str]]] = {}
    for e in getattr(graph, "edges", ()):
        src, dst = unit_of.get(e.src), unit_of.get(e.dst)
        if src is None or dst is None or src == dst:
            continue
        key = (src, e.field)
        lst = inputs.setdefault(dst, [])
        if key not in lst:
            lst.append(key)
    streaming = {u.name for u in graph.execution_units() if getattr(u, "streaming", False)}
    info = {
        "units": units,
        "inputs": {k: tuple(v) for k, v in inputs.items()},
        "streaming": frozenset(streaming),
        "shared_ac": bool(getattr(graph, "shared_actor_critic", False)),
    }
    if len(_GRAPH_INFO) > 256:
        _GRAPH_INFO.clear()
    _GRAPH_INFO[id(graph)] = (graph, info)
    return info


_TOKEN_FLOAT_FIELDS = frozenset(
    ("sample_logprobs", "ref_logprobs", "old_logprobs", "values", "advantages", "returns")
)


def field_bytes(c: UnitContext, field_name: str) -> float:
    """Bytes of one data field for the whole step's batch (what a hand-off moves)."""
    cal = c.calib
    if field_name == "responses":  # full sequences (prompt + response) of token ids
        return c.N * (c.P + c.R) * cal.token_id_bytes
    if field_name == "response_mask":
        return c.N * (c.P + c.R) * 1.0
    if field_name in ("prompts", "answers"):
        return c.N * c.P * cal.token_id_bytes
    if field_name == "rewards":
        return c.N * cal.token_float_bytes
    if field_name in _TOKEN_FLOAT_FIELDS:
        return c.N * c.R * cal.token_float_bytes
    return 0.0  # weights: priced by the weight sync


class UnitContext:
    """Everything derived once per prediction."""

    def __init__(
        self, plan: Plan, wl: Workload, cluster: ClusterSpec, model: ModelSpec, calib: Calibration
    ):
        self.plan, self.wl, self.cluster, self.model, self.calib = plan, wl, cluster, model, calib
        self.gpu = cluster.gpu
        self.prec = (
            "fp8" if wl.precision == "fp8" else ("fp32" if wl.precision == "fp32" else "bf16")
        )
        self.wbytes = costs.BYTES.get(wl.precision, 2.0)
        # the KV cache keeps the activation dtype unless asked otherwise (vLLM
        # kv_cache_dtype="auto"): bf16 for fp8 weights
        self.kvbytes = 4.0 if wl.precision == "fp32" else 2.0
        # achieved compute rate relative to bf16-normalised efficiencies: fp8 GEMMs pay
        # scaling/casting and reach a smaller share of their (2x) peak
        self.peak_flops = self.gpu.peak_flops(self.prec) * (
            calib.fp8_gemm_eff if self.prec == "fp8" else 1.0
        )
        self.assumptions: list[str] = list(wl.assumed)  # e.g. lengths a run measured
        cap = float(wl.max_response_tokens)
        mean = wl.mean_response_tokens
        if wl.turns is not None:  # multi-turn: the transcript's turns and observations
            tkind = wl.response_kind or model.kind
            self.assumptions.extend(turns.assumptions(wl.turns, tkind, calib))
            mean = turns.transcript_mean(wl.turns, tkind, calib, cap) if mean is None else mean
        if mean is None:
            kind = wl.response_kind or model.kind
            mean = prior_mean(kind, cap, calib)
            self.assumptions.append(
                f"mean response length unpublished: assumed {mean:.0f} tokens (prior of "
                f"{kind} models at a {cap:.0f}-token cap)"
            )
        self.lengths = LengthDist(mean, cap, wl.length_sigma or calib.length_sigma)
        self.N = wl.samples
        self.P = wl.mean_prompt_tokens
        # a vision tower: the images' LM tokens are part of every sample's prompt, and the
        # tower runs once per image patch in every pass that runs the model
        self.vision_fwd_flops = 0.0
        if model.vision is not None:
            img = wl.image_tokens
            if img is None:
                img = float(model.vision.image_tokens)
                self.assumptions.append(
                    f"image tokens per sample unpublished: assumed {img:.0f} (prior of "
                    f"{model.name})"
                )
            self.P += img
            self.vision_fwd_flops = (
                2.0 * model.vision.params * img * model.vision.patch_merge * self.N
            )
        self.R = self.lengths.mean
        self.tokens = self.N * (self.P + self.R)
        # sum over sequences of (P + L)^2 for attention terms
        self.seq_sq = self.N * (
            self.P * self.P + 2 * self.P * self.R + self.lengths.second_moment()
        )
        self.max_seq = wl.max_seq_tokens or int((wl.max_prompt_tokens or self.P) + cap)
        # orchestration costs of the runtime driving this cluster (cluster overrides calib)
        self.dispatch_s = _pick(cluster.dispatch_s, calib.dispatch_s)
        self.handoff_latency_s = _pick(cluster.handoff_latency_s, calib.handoff_latency_s)
        self.step_overhead_s = _pick(cluster.step_overhead_s, calib.step_overhead_s)
        if calib.fitted_step_overhead_s is not None:  # measured on this machine
            self.step_overhead_s = calib.fitted_step_overhead_s
        self.host_per_sample_s = _pick(cluster.host_per_sample_s, calib.host_per_sample_s)
        if calib.fitted_host_per_sample_s is not None:  # measured on this machine
            self.host_per_sample_s = calib.fitted_host_per_sample_s


def _pick(override: float | None, default: float) -> float:
    return default if override is None else override


def unit_plan(plan: Plan, name: str) -> UnitPlan:
    u = plan.units.get(name)
    if u is None:
        raise InfeasiblePlan(
            "devices", f"execution unit {name!r} has no placement in the plan", unit=name
        )
    return u


# --- forward / training -----------------------------------------------------------------
def _dense_expert_split(m: ModelSpec) -> tuple[float, float]:
    """(dense matmul params, active expert matmul params) per token."""
    if not m.moe:
        return float(m.matmul_params), 0.0
    expert = m.moe_layers * m.moe.top_k * m.expert_params
    return float(m.matmul_params - expert), float(expert)


#: ``reshard_after_forward: auto`` keeps an FSDP training unit's parameters gathered from
#: forward to backward when the extra memory (the rank's unsharded parameters less its own
#: shard) is at most this share of a device's memory. 5% (it was 10%): at 10% a 302M-parameter
#: fp32 model on two 8 GB CPU workers stayed gathered, and each rank's peak held the whole
#: model (predicted 4.9 GB, vs 4.0 resharded); the published rows price the same either way
#: (rpeg validate: pooled LOSO 20.17% at both, 2026-12-05)
GATHERED_MEMORY_SHARE = 0.05


#: ``recompute: auto`` checkpoints a training unit's decoder layers when the activations it
#: would keep without recompute pass this share of a device's memory
RECOMPUTE_MEMORY_SHARE = 0.25


def recomputes(setting: bool | str, act_full_gb: float, device_gb: float) -> bool:
    """Whether a training pass checkpoints its decoder layers (``UnitPlan.recompute``; ``auto``:
    when ``act_full_gb``, the activations kept without recompute, pass
    :data:`RECOMPUTE_MEMORY_SHARE` of ``device_gb``)."""
    if setting == "auto":
        return act_full_gb > RECOMPUTE_MEMORY_SHARE * device_gb
    return bool(setting)


def full_activation_bytes(
    m: ModelSpec, tok_dev: float, tp: int, pp: int, in_flight: float, cal: Calibration
) -> float:
    """Bytes of the activations one rank keeps for backward without recompute: ``tok_dev``
    tokens of a micro-batch through its ``layers / pp`` layers, ``in_flight`` micro-batches
    (a pipeline holds up to ``pp``)."""
    per = cal.act_bytes_per_hidden_full / tp
    return tok_dev * m.hidden * per * (m.layers / pp) * in_flight


def params_per_device(m: ModelSpec, tp: int, pp: int, ep: int) -> float:
    """Parameters one rank of a ``tp x pp`` (``ep`` for experts) layout holds unsharded."""
    expert_all = m.moe_layers * m.moe.experts * m.expert_params if m.moe else 0
    return (m.params - expert_all) / (tp * pp) + expert_all / (ep * pp)


def gathered_extra_gb(params_dev: float, wbytes: float, dp: int) -> float:
    """GB a rank holds beyond its FSDP shard while its whole unsharded layout stays
    gathered: ``params_dev * wbytes * (1 - 1/dp)``."""
    return params_dev * wbytes * (1.0 - 1.0 / max(1, dp)) / GB


def keeps_gathered(setting: bool | str, extra_gb: float, device_gb: float) -> bool:
    """Whether an FSDP training pass keeps its parameters gathered from forward to backward
    (``UnitPlan.reshard_after_forward`` false; ``auto``: the extra fits
    :data:`GATHERED_MEMORY_SHARE` of ``device_gb``). Only meaningful for dp > 1."""
    if setting == "auto":
        return extra_gb <= GATHERED_MEMORY_SHARE * device_gb
    return not setting


def _fsdp_dp(u: UnitPlan) -> int:
    return max(1, u.num_devices // (u.tp * u.pp)) if u.engine == "fsdp" else 1


def unit_keeps_gathered(c: UnitContext, u: UnitPlan) -> bool:
    """:func:`keeps_gathered` for a training unit priced in ``c``."""
    dp = _fsdp_dp(u)
    if dp <= 1:
        return False
    p_dev = params_per_device(c.model, u.tp, u.pp, u.ep)
    return keeps_gathered(
        u.reshard_after_forward, gathered_extra_gb(p_dev, c.wbytes, dp), c.gpu.usable_hbm_gb
    )


def _train_state_per_device(c: UnitContext, u: UnitPlan, trainable: bool) -> dict[str, float]:
    p_dev = params_per_device(c.model, u.tp, u.pp, u.ep)
    fsdp = u.engine == "fsdp"
    dp = max(1, u.num_devices // (u.tp * u.pp))
    out = {"weights": p_dev * c.wbytes / GB / (dp if fsdp else 1)}
    if trainable:
        p_train = trainable_params(c.model, c.wl, p_dev, u.tp)  # LoRA: adapters (perf.lora)
        out |= adapter_memory(c.model, c.wl, p_dev, c.wbytes, dp if fsdp else 1, u.tp)
        out["gradients"] = p_train * 2.0 / GB / (dp if fsdp else 1)
        out["optimizer"] = p_train * 12.0 / dp / GB  # fp32 master + Adam m, v (distributed)
        if c.wl.assumed_optimizer_on_host:
            out["optimizer"] = 0.0  # on the host (priced in pass_cost: host_optimizer_s)
        if unit_keeps_gathered(c, u):
            out["gathered_weights"] = gathered_extra_gb(p_dev, c.wbytes, dp)
    return out


#: bytes per parameter of an offloaded optimizer step over the host link (fp32 gradients
#: down, bf16 parameters up) and of its CPU Adam in host memory (read master, m, v, gradient;
#: write master, m, v)
HOST_LINK_BYTES_PER_PARAM = 6.0
HOST_ADAM_BYTES_PER_PARAM = 28.0


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


def pass_cost(c: UnitContext, u: UnitPlan, name: str, kind: str, train: bool) -> StageCost:
    m, gpu, cal = c.model, c.gpu, c.calib
    n = u.num_devices
    tp, pp, cp, ep = u.tp, u.pp, u.cp, u.ep
    dp = max(1, n // (tp * pp * cp))
    sc = StageCost(name, (kind,), format_devices(u.devices), n)
    cpu = eager_cpu.is_cpu(gpu)  # RPEG's eager CPU workers (rpeg.perf.eager_cpu)
    dense_p, expert_p = _dense_expert_split(m)
    # tokens in one micro-batch (packed to the sequence budget) and per device
    tok_mb = c.max_seq * u.micro_batch_size if u.seq_packing else (c.P + c.R) * u.micro_batch_size
    tok_rank = c.tokens / dp
    tok_mb = min(tok_mb, tok_rank)
    vbytes = eager_cpu.comm_value_bytes(c.wl.precision)
    mb = eager_cpu.micro_batches(c, dp, u.micro_batch_size, train)  # the runtime's, on CPU
    tok_mb = mb.tokens if cpu else tok_mb
    tok_dev = tok_mb / cp
    tok_rank_mb = c.tokens / dp / max(1, c.wl.train_minibatches) / tok_mb
    in_flight = min(pp, max(1.0, tok_rank_mb)) if train else 1.0
    act_full = full_activation_bytes(m, tok_dev, tp, pp, in_flight, cal)
    # the runtime checkpoints each decoder layer (rpeg.runtime.unit_memory) when the
    # plan says so; ``auto``: when the activations kept without it would crowd the device
    recompute = train and recomputes(u.recompute, act_full / GB, gpu.usable_hbm_gb)
    sc.detail["recompute"] = float(recompute)
    if train:
        flops = costs.train_flops(m, c.tokens, c.seq_sq, recompute)
        passes = 4.0 if recompute else 3.0
    else:
        flops = costs.forward_flops(m, c.tokens, c.seq_sq)
        passes = 1.0
    gemm_dense = (
        2.0
        * tok_dev
        * m.hidden
        * max(m.ffn_hidden if not m.moe else m.attn_width, m.attn_width)
        / tp
    )
    eff_dense = gpu.matmul_eff(gemm_dense)
    factor = pass_factor(cal.train_eff_factor if train else cal.forward_eff_factor, gpu)
    peak = c.peak_flops * n
    # flash-attention backward recomputes the scores: 5 s^2 matmuls vs 2 in the forward
    attn = costs.attn_fwd_flops(m, c.seq_sq) * costs.attn_passes(passes, train, cal)
    dense_flops = passes * 2.0 * dense_p * c.tokens + passes * c.vision_fwd_flops
    flops += passes * c.vision_fwd_flops
    t_dense = dense_flops / (peak * eff_dense * factor)
    # fused attention kernels reach their own share of the peak (not the GEMM curve's)
    t_dense += attn / (peak * (cal.attn_eff or eff_dense * factor))
    sc.detail["attn_s"] = attn / (peak * (cal.attn_eff or eff_dense * factor))
    t_exp = 0.0
    if expert_p:
        tok_expert = tok_dev * m.moe.top_k / m.moe.experts * ep
        gemm_e = 2.0 * tok_expert * m.hidden * m.moe.expert_ffn_hidden
        eff_e = gpu.matmul_eff(gemm_e)
        t_exp = passes * 2.0 * expert_p * c.tokens / (peak * eff_e * factor)
        sc.detail["expert_gemm_eff"] = eff_e
    t_comp = t_dense + t_exp
    # log-softmax over the vocabulary in fp32: memory-bound passes over the logits
    vpasses = cal.vocab_passes_train if train else cal.vocab_passes_fwd
    if vpasses:
        t_vocab = c.tokens * m.vocab * 4.0 * vpasses / (n * gpu.hbm_bytes_per_s * gpu.software_eff)
        t_comp += t_vocab
        sc.detail["vocab_s"] = t_vocab
    # fixed per-layer cost per micro-batch and pass (launch / host sync / MoE routing)
    n_micro_dev = mb.count if cpu else c.tokens / dp / min(tok_mb, c.tokens / dp)
    per_layer = (gpu.layer_overhead_s or cal.layer_overhead_s) * m.dense_layers + (
        cal.moe_layer_overhead_s * m.moe_layers
    )
    t_comp += n_micro_dev * passes * per_layer / pp
    if m.moe and ep == 1 and u.engine == "fsdp":
        # FSDP trainers run the HF modules, whose MoE block loops over the experts in
        # Python (one host sync + ~8 small kernels per expert hit), unlike Megatron's
        # grouped GEMM: a fixed cost per expert per MoE layer per micro-batch and pass
        loop = n_micro_dev * passes * cal.moe_expert_loop_s * m.moe.experts * m.moe_layers
        t_comp += loop / pp
        sc.detail["moe_expert_loop_s"] = loop / pp
    # pipeline bubble per mini-batch
    mbs_per_minibatch = (
        max(1.0, tok_rank / c.wl.train_minibatches / tok_mb)
        if train
        else max(1.0, tok_rank / tok_mb)
    )
    bubble = (pp - 1) / mbs_per_minibatch if pp > 1 else 0.0
    n_micro = mb.count if cpu else tok_rank / tok_mb
    comm: dict[str, float] = {}
    first = u.devices[0]
    # tensor parallel: 2 all-reduces (or RS+AG) per layer per pass of one micro-batch
    if tp > 1:
        lvl, bw, alpha = costs.group_link(c.cluster, first, tp)
        ar = costs.allreduce_time(tok_dev * m.hidden * vbytes, tp, bw, alpha, cal.nccl_bus_eff)
        comm[lvl] = comm.get(lvl, 0.0) + n_micro * passes * 2 * m.layers / pp * ar
        if train:  # LoRA: the replicated factors' gradients, summed once per optimizer step
            g = tp_grad_sum_bytes(m, c.wl, params_per_device(m, tp, pp, ep), tp)
            ar = c.wl.train_minibatches * costs.allreduce_time(g, tp, bw, alpha, cal.nccl_bus_eff)
            if ar:
                comm[lvl] += ar
                sc.detail["lora_tp_grad_sum_s"] = ar
    # expert parallel: dispatch + combine per MoE layer per pass
    if m.moe and ep > 1:
        # with tensor parallel, sequence parallel splits the tokens over the tp ranks first
        a2a_bytes = tok_dev / tp * m.moe.top_k * m.hidden * 2.0
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
            t_b, l_b = costs.alltoall_time(a2a_bytes, ep, c.cluster, b0, tp * cp, cal.nccl_bus_eff)
            if t_b > ta:
                ta, lvl = t_b, l_b
        comm[lvl] = comm.get(lvl, 0.0) + n_micro * passes * 2 * m.moe_layers / pp * ta
    # context parallel: K/V exchange per layer (ring), bandwidth term only
    if cp > 1:
        lvl, bw, alpha = costs.group_link(c.cluster, first, cp, tp)
        full = max(1, m.full_attn_layers)  # linear-attention layers exchange no K/V
        kvb = tok_dev * m.kv_bytes_per_token(2.0) / full * (cp - 1)
        comm[lvl] = comm.get(lvl, 0.0) + n_micro * passes * full / pp * (
            kvb / (bw * cal.nccl_bus_eff)
        )
    # data parallel gradient reduce-scatter + parameter all-gather per optimizer step
    state = _train_state_per_device(c, u, train)
    if train and dp > 1:
        lvl = c.cluster.span_level_contiguous(first, n)
        link = c.cluster.link(lvl)
        p_bytes = state["weights"] * GB / c.wbytes * vbytes
        per_step = 2 * costs.gather_time(
            p_bytes, dp, link.bytes_per_s, link.latency_s, cal.nccl_bus_eff
        )
        if u.engine == "fsdp":
            # FSDP gathers parameters for every micro-batch (forward, and again in backward
            # unless they stay gathered) and reduce-scatters its gradients, overlapped with
            # compute
            collectives = 2 if "gathered_weights" in state else 3
            sc.detail["fsdp_collectives_per_micro_batch"] = float(collectives)
            fs = (
                n_micro
                / max(1, c.wl.train_minibatches)
                * collectives
                * costs.gather_time(
                    p_bytes * dp, dp, link.bytes_per_s, link.latency_s, cal.nccl_bus_eff
                )
            )
            t_comp = eager_cpu.overlap(gpu, t_comp, fs * c.wl.train_minibatches, comm, lvl)
        comm[lvl] = comm.get(lvl, 0.0) + per_step * c.wl.train_minibatches
    if not train and u.engine == "fsdp" and dp > 1:
        lvl = c.cluster.span_level_contiguous(first, n)
        link = c.cluster.link(lvl)
        p_bytes = m.params * vbytes / (tp * pp)
        fs = n_micro * costs.gather_time(
            p_bytes, dp, link.bytes_per_s, link.latency_s, cal.nccl_bus_eff
        )
        t_comp = eager_cpu.overlap(gpu, t_comp, fs, comm, lvl)
    # optimizer update: read/write 16 B per local parameter
    t_opt = 0.0
    if train:
        t_opt = (
            c.wl.train_minibatches
            * eager_cpu.updated_gb(state["optimizer"], cpu and u.engine != "fsdp", dp)
            * (GB / 12.0 * 16.0 * 2 / gpu.hbm_bytes_per_s)
        )
    if train and c.wl.assumed_optimizer_on_host:
        t_opt += c.wl.train_minibatches * host_optimizer_s(c, u, dp)
    scale = cal.train_eff_scale if train else cal.fwd_eff_scale
    sc.time_s = eager_cpu.scaled(gpu, t_comp * (1.0 + bubble) + t_opt, sum(comm.values()), scale)
    sc.flops = flops
    sc.comm_s = comm
    # activations per device
    layers_dev = m.layers / pp
    if train:
        per = (
            cal.act_bytes_per_hidden_recompute if recompute else cal.act_bytes_per_hidden_full / tp
        )
        act = tok_dev * m.hidden * per * layers_dev * min(pp, mbs_per_minibatch)
        if recompute:
            act += tok_dev * m.hidden * cal.act_bytes_per_hidden_full / tp
    else:
        act = tok_dev * m.hidden * 2.0 * 4
    logits = min(tok_dev, cal.logits_chunk_tokens) * m.vocab / tp * 4.0 * (2 if train else 1)
    sc.memory_gb = {
        **state,
        "activations": act / GB,
        "logits": logits / GB,
        "framework": cal.reserve_gb,
    }
    sc.detail.update(
        mfu_gemm_dense=eff_dense * factor,
        bubble=bubble,
        micro_batches=n_micro,
        compute_s=t_comp,
        optimizer_s=t_opt,
    )
    return sc
