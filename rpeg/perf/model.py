"""The analytical performance model: Graph + Plan + Workload + Cluster -> step prediction.

Pure and fast (tens of microseconds per plan). Every equation is in docs/perf-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rpeg.perf import costs
from rpeg.perf.calib import DEFAULT, Calibration
from rpeg.perf.lengths import LengthDist
from rpeg.perf.timeline import TimelineRecord
from rpeg.plan.plan import InfeasiblePlan, Plan, UnitPlan, format_devices
from rpeg.specs import ClusterSpec, ModelSpec

GB = 1e9


# --- inputs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """What one RL step processes (built from :class:`rpeg.config.WorkloadConfig`)."""

    num_prompts: int
    samples_per_prompt: int
    mean_prompt_tokens: float
    max_response_tokens: int
    mean_response_tokens: float | None = None
    train_minibatches: int = 1
    micro_batch_size: int = 1
    precision: str = "bf16"
    max_prompt_tokens: int | None = None
    max_seq_tokens: int | None = None  # packing budget; None = prompt cap + response cap

    @classmethod
    def from_config(cls, w: Any) -> Workload:
        return cls(
            num_prompts=w.num_prompts,
            samples_per_prompt=w.samples_per_prompt,
            mean_prompt_tokens=float(w.mean_prompt_tokens or w.max_prompt_tokens),
            max_prompt_tokens=w.max_prompt_tokens,
            max_response_tokens=w.max_response_tokens,
            mean_response_tokens=w.mean_response_tokens,
            train_minibatches=w.train_minibatches,
            micro_batch_size=w.micro_batch_size,
            precision=w.precision,
        )

    @property
    def samples(self) -> int:
        return self.num_prompts * self.samples_per_prompt


# --- outputs ----------------------------------------------------------------------------
@dataclass
class StageCost:
    """Predicted cost of one execution unit in one RL step."""

    name: str
    kinds: tuple[str, ...]
    devices: str
    num_devices: int
    time_s: float = 0.0
    flops: float = 0.0
    hbm_bytes: float = 0.0
    comm_s: dict[str, float] = field(default_factory=dict)  # by link level
    memory_gb: dict[str, float] = field(default_factory=dict)  # per-device breakdown
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def peak_memory_gb(self) -> float:
        return sum(self.memory_gb.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kinds": list(self.kinds),
            "devices": self.devices,
            "num_devices": self.num_devices,
            "time_s": self.time_s,
            "flops": self.flops,
            "hbm_bytes": self.hbm_bytes,
            "comm_s": dict(self.comm_s),
            "peak_memory_gb": self.peak_memory_gb,
            "memory_gb": dict(self.memory_gb),
            "detail": dict(self.detail),
        }


@dataclass
class StepPrediction:
    step_s: float
    stages: dict[str, StageCost]
    num_devices: int
    tokens_per_step: float
    tokens_per_s_per_gpu: float
    mfu: float
    timeline: list[TimelineRecord]
    device_memory_gb: dict[str, float]  # peak per device group (co-resident units)
    capacity_gb: float
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "num_devices": self.num_devices,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "capacity_gb": self.capacity_gb,
            "device_memory_gb": dict(self.device_memory_gb),
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "timeline": [r.to_dict() for r in self.timeline],
            "assumptions": list(self.assumptions),
        }


# --- helpers ----------------------------------------------------------------------------
_GEN = "generate"
_FWD = ("ref_logprob", "old_logprob", "values")
_TRAIN = ("train_actor", "train_critic")


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


def _graph_info(graph: Any) -> dict[str, Any]:
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


def field_bytes(c: _Ctx, field_name: str) -> float:
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


class _Ctx:
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
        self.kvbytes = 1.0 if wl.precision == "fp8" else (4.0 if wl.precision == "fp32" else 2.0)
        self.assumptions: list[str] = []
        cap = float(wl.max_response_tokens)
        mean = wl.mean_response_tokens
        if mean is None:
            if model.typical_response_tokens:
                mean = min(cap * 0.999, float(model.typical_response_tokens))
                self.assumptions.append(
                    f"mean response length unpublished: assumed {mean:.0f} tokens (catalog typical for {model.name})"
                )
            else:
                mean = 0.35 * cap
                self.assumptions.append(
                    f"mean response length unpublished: assumed 0.35 x cap = {mean:.0f}"
                )
        self.lengths = LengthDist(mean, cap, calib.length_sigma)
        self.N = wl.samples
        self.P = wl.mean_prompt_tokens
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


def _pick(override: float | None, default: float) -> float:
    return default if override is None else override


def _unit_plan(plan: Plan, name: str) -> UnitPlan:
    u = plan.units.get(name)
    if u is None:
        raise InfeasiblePlan(
            "devices", f"execution unit {name!r} has no placement in the plan", unit=name
        )
    return u


# --- generation -------------------------------------------------------------------------
def _generation(c: _Ctx, u: UnitPlan, name: str, throughput_mode: bool) -> StageCost:
    m, gpu, cal = c.model, c.gpu, c.calib
    tp, pp = u.tp, u.pp
    replica = tp * pp
    replicas = u.num_devices // replica
    first = u.devices[0]
    sc = StageCost(name, (_GEN,), format_devices(u.devices), u.num_devices)
    w_dev = m.params * c.wbytes / replica
    budget = u.gpu_memory_utilization * gpu.usable_hbm_gb * GB
    act_reserve = (
        1.0 * GB + 2.0 * cal.max_num_seqs * m.vocab * 4 / tp / 16
    )  # logits/sampling buffers
    kv_free = budget - w_dev - act_reserve
    sc.memory_gb = {
        "weights": w_dev / GB,
        "kv_cache": max(kv_free, 0) / GB,
        "engine_reserve": act_reserve / GB,
    }
    if kv_free <= 0:
        raise InfeasiblePlan(
            "memory",
            f"generation weights {w_dev / GB:.1f} GB + reserve {act_reserve / GB:.1f} GB exceed the "
            f"{budget / GB:.1f} GB budget (gpu_memory_utilization={u.gpu_memory_utilization} x {gpu.usable_hbm_gb} GB)",
            unit=name,
            needed_gb=(w_dev + act_reserve) / GB,
            capacity_gb=budget / GB,
            device=first,
            breakdown=dict(sc.memory_gb),
        )
    kv_tok_dev = costs.kv_cache_bytes(m, 1.0, tp, c.kvbytes) / pp
    kv_tokens = kv_free / kv_tok_dev
    S = c.N / replicas  # sequences per replica per step
    L = c.lengths
    b_kv = kv_tokens / (c.P + L.mean)  # sequences whose average footprint fits
    b_max = max(1.0, min(cal.max_num_seqs, b_kv))

    def step(b: float, ctx: float) -> tuple[float, float, float, float]:
        return costs.decode_step_time(
            m,
            gpu,
            c.cluster,
            batch=b,
            context=ctx,
            tp=tp,
            pp=pp,
            first_device=first,
            wbytes=c.wbytes,
            kvbytes=c.kvbytes,
            calib=cal,
            precision=c.prec,
        )

    t = fl = by = comm = 0.0
    # prefill of all prompts (compute-bound)
    pf_tokens = S * c.P
    pf_flops = costs.forward_flops(m, pf_tokens, S * c.P * c.P) / replica
    gemm = 2.0 * min(pf_tokens, 8192) * m.hidden * max(m.ffn_hidden, m.attn_width) / tp
    t_pf = pf_flops / (gpu.peak_flops(c.prec) * gpu.matmul_eff(gemm) * cal.train_eff_factor)
    t += t_pf
    fl += pf_flops
    if throughput_mode:
        # Steady state of an asynchronous engine (partial rollout): always b_eff sequences in
        # flight, no per-step tail. Cost = tokens / (b_eff tokens per step).
        b_eff = min(b_max, S * (1 + c.plan.staleness))
        ctx = c.P + L.second_moment() / (2 * L.mean)
        ts, f1, b1, cm = step(b_eff, ctx)
        n_steps = S * L.mean / b_eff
        t += n_steps * ts
        fl += n_steps * f1
        by += n_steps * b1
        comm += n_steps * cm
        sc.detail.update(batch=b_eff, decode_steps=n_steps)
    else:
        lmax = L.expected_max(c.N)
        bulk = 0.0
        if b_max < S:
            # continuous batching: the first S - b_max sequences stream through a full batch
            ctx = c.P + L.second_moment() / (2 * L.mean)
            ts, f1, b1, cm = step(b_max, ctx)
            n_steps = (S - b_max) * L.mean / b_max
            bulk = n_steps * ts
            fl += n_steps * f1
            by += n_steps * b1
            comm += n_steps * cm
            tail_n = b_max
        else:
            tail_n = S
        # the last batch decodes together until its longest response ends (midpoint rule)
        K = 12
        seg = lmax / K
        tail = 0.0
        for i in range(K):
            tm = (i + 0.5) * seg
            # the longest response is still decoding until lmax: at least one sequence lives
            live = max(tail_n * L.survival(tm), 1.0)
            ts, f1, b1, cm = step(live, c.P + tm)
            tail += seg * ts
            fl += seg * f1
            by += seg * b1
            comm += seg * cm
        t += bulk + tail
        sc.detail.update(batch=min(S, b_max), longest_response=lmax, tail_s=tail, bulk_s=bulk)
    level = c.cluster.span_level_contiguous(first, tp) if tp > 1 else "device"
    sc.time_s = t
    sc.flops = fl * replica * replicas
    sc.hbm_bytes = by * replica * replicas
    sc.comm_s = {level: comm} if comm else {}
    sc.detail.update(
        prefill_s=t_pf, kv_capacity_tokens=kv_tokens, replicas=replicas, seqs_per_replica=S
    )
    return sc


# --- forward / training -----------------------------------------------------------------
def _dense_expert_split(m: ModelSpec) -> tuple[float, float]:
    """(dense matmul params, active expert matmul params) per token."""
    if not m.moe:
        return float(m.matmul_params), 0.0
    expert = m.moe_layers * m.moe.top_k * m.expert_params
    return float(m.matmul_params - expert), float(expert)


def _train_state_per_device(c: _Ctx, u: UnitPlan, trainable: bool) -> dict[str, float]:
    m = c.model
    n = u.num_devices
    if m.moe:
        expert_all = m.moe_layers * m.moe.experts * m.expert_params
    else:
        expert_all = 0
    dense = m.params - expert_all
    p_dev = dense / (u.tp * u.pp) + expert_all / (u.ep * u.pp)
    fsdp = u.engine == "fsdp"
    dp = max(1, n // (u.tp * u.pp))
    out = {"weights": p_dev * c.wbytes / GB / (dp if fsdp else 1)}
    if trainable:
        out["gradients"] = p_dev * 2.0 / GB / (dp if fsdp else 1)
        out["optimizer"] = p_dev * 12.0 / dp / GB  # fp32 master + Adam m, v (distributed)
    return out


def _pass(c: _Ctx, u: UnitPlan, name: str, kind: str, train: bool) -> StageCost:
    m, gpu, cal = c.model, c.gpu, c.calib
    n = u.num_devices
    tp, pp, cp, ep = u.tp, u.pp, u.cp, u.ep
    dp = max(1, n // (tp * pp * cp))
    sc = StageCost(name, (kind,), format_devices(u.devices), n)
    recompute = u.recompute and train
    if train:
        flops = costs.train_flops(m, c.tokens, c.seq_sq, recompute)
        passes = 4.0 if recompute else 3.0
    else:
        flops = costs.forward_flops(m, c.tokens, c.seq_sq)
        passes = 1.0
    dense_p, expert_p = _dense_expert_split(m)
    # tokens in one micro-batch (packed to the sequence budget) and per device
    tok_mb = c.max_seq * u.micro_batch_size if u.seq_packing else (c.P + c.R) * u.micro_batch_size
    tok_rank = c.tokens / dp
    tok_mb = min(tok_mb, tok_rank)
    tok_dev = tok_mb / cp
    gemm_dense = (
        2.0
        * tok_dev
        * m.hidden
        * max(m.ffn_hidden if not m.moe else m.attn_width, m.attn_width)
        / tp
    )
    eff_dense = gpu.matmul_eff(gemm_dense)
    factor = cal.train_eff_factor if train else cal.forward_eff_factor
    peak = gpu.peak_flops(c.prec) * n
    # flash-attention backward recomputes the scores: 5 s^2 matmuls vs 2 in the forward
    attn = costs.attn_fwd_flops(m, c.seq_sq) * costs.attn_passes(passes, train, cal)
    dense_flops = passes * 2.0 * dense_p * c.tokens + attn
    t_dense = dense_flops / (peak * eff_dense * factor)
    t_exp = 0.0
    if expert_p:
        tok_expert = tok_dev * m.moe.top_k / m.moe.experts * ep
        gemm_e = 2.0 * tok_expert * m.hidden * m.moe.expert_ffn_hidden
        eff_e = gpu.matmul_eff(gemm_e)
        t_exp = passes * 2.0 * expert_p * c.tokens / (peak * eff_e * factor)
        sc.detail["expert_gemm_eff"] = eff_e
    t_comp = t_dense + t_exp
    # fixed per-layer cost per micro-batch and pass (launch / host sync / MoE routing)
    n_micro_dev = c.tokens / dp / min(tok_mb, c.tokens / dp)
    per_layer = (gpu.layer_overhead_s or cal.layer_overhead_s) * m.dense_layers + (
        cal.moe_layer_overhead_s * m.moe_layers
    )
    t_comp += n_micro_dev * passes * per_layer / pp
    # pipeline bubble per mini-batch
    mbs_per_minibatch = (
        max(1.0, tok_rank / c.wl.train_minibatches / tok_mb)
        if train
        else max(1.0, tok_rank / tok_mb)
    )
    bubble = (pp - 1) / mbs_per_minibatch if pp > 1 else 0.0
    n_micro = tok_rank / tok_mb
    comm: dict[str, float] = {}
    first = u.devices[0]
    # tensor parallel: 2 all-reduces (or RS+AG) per layer per pass of one micro-batch
    if tp > 1:
        lvl, bw, alpha = costs.group_link(c.cluster, first, tp)
        ar = costs.allreduce_time(tok_dev * m.hidden * 2.0, tp, bw, alpha, cal.nccl_bus_eff)
        comm[lvl] = comm.get(lvl, 0.0) + n_micro * passes * 2 * m.layers / pp * ar
    # expert parallel: dispatch + combine per MoE layer per pass
    if m.moe and ep > 1:
        # with tensor parallel, sequence parallel splits the tokens over the tp ranks first
        a2a_bytes = tok_dev / tp * m.moe.top_k * m.hidden * 2.0
        # the EP groups tile the pool in blocks of ep*tp*cp devices; every group waits for
        # the slowest one (a block straddling a scale-up domain boundary)
        block = ep * tp * cp
        ta, lvl = 0.0, "device"
        for b0 in range(first, first + max(block, n - block + 1), block):
            t_b, l_b = costs.alltoall_time(a2a_bytes, ep, c.cluster, b0, tp * cp, cal.nccl_bus_eff)
            if t_b > ta:
                ta, lvl = t_b, l_b
        comm[lvl] = comm.get(lvl, 0.0) + n_micro * passes * 2 * m.moe_layers / pp * ta
    # context parallel: K/V exchange per layer (ring), bandwidth term only
    if cp > 1:
        lvl, bw, alpha = costs.group_link(c.cluster, first, cp, tp)
        kvb = tok_dev * m.kv_bytes_per_token(2.0) / m.layers * (cp - 1)
        comm[lvl] = comm.get(lvl, 0.0) + n_micro * passes * m.layers / pp * (
            kvb / (bw * cal.nccl_bus_eff)
        )
    # data parallel gradient reduce-scatter + parameter all-gather per optimizer step
    state = _train_state_per_device(c, u, train)
    if train and dp > 1:
        lvl = c.cluster.span_level_contiguous(first, n)
        link = c.cluster.link(lvl)
        p_bytes = state["weights"] * GB / c.wbytes * 2.0
        per_step = 2 * costs.gather_time(
            p_bytes, dp, link.bytes_per_s, link.latency_s, cal.nccl_bus_eff
        )
        if u.engine == "fsdp":
            # FSDP re-gathers parameters for every micro-batch (fwd + bwd), overlapped with compute
            fs = (
                n_micro
                / max(1, c.wl.train_minibatches)
                * 3
                * costs.gather_time(
                    p_bytes * dp, dp, link.bytes_per_s, link.latency_s, cal.nccl_bus_eff
                )
            )
            t_comp = max(t_comp, fs * c.wl.train_minibatches)
        comm[lvl] = comm.get(lvl, 0.0) + per_step * c.wl.train_minibatches
    if not train and u.engine == "fsdp" and dp > 1:
        lvl = c.cluster.span_level_contiguous(first, n)
        link = c.cluster.link(lvl)
        p_bytes = m.params * 2.0 / (tp * pp)
        fs = n_micro * costs.gather_time(
            p_bytes, dp, link.bytes_per_s, link.latency_s, cal.nccl_bus_eff
        )
        t_comp = max(t_comp, fs)
    # optimizer update: read/write 16 B per local parameter
    t_opt = 0.0
    if train:
        t_opt = (
            c.wl.train_minibatches * state["optimizer"] * GB / 12.0 * 16.0 * 2 / gpu.hbm_bytes_per_s
        )
    sc.time_s = t_comp * (1.0 + bubble) + sum(comm.values()) + t_opt
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
    logits = tok_dev * m.vocab / tp * 4.0 * (2 if train else 1)
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


def _weight_sync(
    c: _Ctx, name: str, u: UnitPlan, gen: UnitPlan | None, train: UnitPlan | None
) -> StageCost:
    """Trainer layout -> generation layout. Same devices: a reshard through the domain
    fabric (CUDA IPC); disjoint pools: a broadcast over the link spanning both."""
    sc = StageCost(name, ("sync_weights",), format_devices(u.devices), u.num_devices)
    if gen is None:
        return sc
    m, cal = c.model, c.calib
    gen_shard = m.params * c.wbytes / (gen.tp * gen.pp)
    same = (
        train is not None
        and gen.devices[0] <= train.devices[-1]
        and train.devices[0] <= gen.devices[-1]
    )
    if same:
        link = c.cluster.link("domain")
        lvl = "domain"
    else:
        allv = tuple(sorted(set(gen.devices) | set(train.devices if train else ())))
        lvl = c.cluster.span_level(allv)
        link = c.cluster.link(lvl)
    t = gen_shard / (link.bytes_per_s * cal.nccl_bus_eff) + 2 * m.layers * link.latency_s
    t_tensors = m.hf_tensors * cal.refit_tensor_s
    sc.time_s = t + t_tensors
    sc.detail.update(refit_bytes_s=t, refit_tensors_s=t_tensors, hf_tensors=m.hf_tensors)
    sc.comm_s = {lvl: t}
    sc.hbm_bytes = gen_shard * gen.num_devices
    return sc


# --- one execution unit -------------------------------------------------------------------
def _gen_train_plans(
    plan: Plan, units: list[tuple[str, tuple[tuple[str, str, str], ...]]]
) -> tuple[UnitPlan | None, UnitPlan | None]:
    gen_plan = train_plan = None
    for uname, members in units:
        kinds = {k for _, k, _ in members}
        if _GEN in kinds and gen_plan is None:
            gen_plan = _unit_plan(plan, uname)
        if "train_actor" in kinds and train_plan is None:
            train_plan = _unit_plan(plan, uname)
    return gen_plan, train_plan


def _price_unit(
    c: _Ctx,
    info: dict[str, Any],
    uname: str,
    members: tuple[tuple[str, str, str], ...],
    gen_plan: UnitPlan | None,
    train_plan: UnitPlan | None,
) -> StageCost:
    """Cost of one execution unit: its stages, the streaming overlap inside a fused group,
    the dispatch of its task and the hand-off of its inputs from other process groups."""
    plan = c.plan
    u = _unit_plan(plan, uname)
    throughput_mode = plan.partial_rollout and plan.staleness >= 1
    reuse_logprobs = bool(plan.graph.options.get("reuse_rollout_logprobs", False))
    if c.cluster.reuses_rollout_logprobs and gen_plan is not None and train_plan is not None:
        # the sampling log-probs are the old ones when the rollout used the current weights
        reuse_logprobs = (
            reuse_logprobs or plan.staleness == 0 or gen_plan.devices == train_plan.devices
        )
    shared_ac = info["shared_ac"]
    parts: list[StageCost] = []
    for sname, kind, role in members:
        if kind == _GEN:
            parts.append(_generation(c, u, sname, throughput_mode))
        elif kind in _TRAIN:
            sc = _pass(c, u, sname, kind, train=True)
            if shared_ac and kind == "train_actor":
                _value_head(c, u, sc, train=True)
            parts.append(sc)
        elif kind in _FWD:
            if kind == "old_logprob" and reuse_logprobs:
                sc = StageCost(sname, (kind,), format_devices(u.devices), u.num_devices)
            else:
                sc = _pass(c, u, sname, kind, train=False)
            if shared_ac and kind == "old_logprob":
                _value_head(c, u, sc, train=False)
            parts.append(sc)
        elif kind == "reward" and role == "reward_model":
            parts.append(_pass(c, u, sname, kind, train=False))
        elif kind == "sync_weights":
            parts.append(_weight_sync(c, sname, u, gen_plan, train_plan))
        else:  # rule reward, advantage: negligible on the accelerator
            parts.append(StageCost(sname, (kind,), format_devices(u.devices), u.num_devices))
    overlap = 0.0
    if uname in info["streaming"] and len(parts) > 1 and parts[0].kinds == (_GEN,):
        # streaming fusion: the consumers work on samples as they finish, hidden under the
        # generation tail (under-full decode batches); only the last sample's share follows
        consumer = sum(p.time_s for p in parts[1:])
        seqs = max(1.0, parts[0].detail.get("seqs_per_replica", 1.0))
        overlap = min(consumer * (1.0 - 1.0 / seqs), parts[0].detail.get("tail_s", 0.0))
    sc = _merge(uname, parts, u)
    # hand-off: input fields produced by units on other devices cross processes
    handoff = 0.0
    moved = 0.0
    srcs: set[str] = set()
    for src, fname in info["inputs"].get(uname, ()):
        su = plan.units.get(src)
        if su is None or su.devices == u.devices:
            continue  # same process group: the batch stays in the workers
        srcs.add(src)
        nbytes = field_bytes(c, fname)
        if nbytes:
            lo = min(su.devices[0], u.devices[0])
            hi = max(su.devices[-1], u.devices[-1])
            link = c.cluster.link(c.cluster.span_level_contiguous(lo, hi - lo + 1))
            handoff += nbytes / link.bytes_per_s
            moved += nbytes
    handoff += len(srcs) * c.handoff_latency_s
    sc.time_s += c.dispatch_s + handoff - overlap
    sc.detail["dispatch_s"] = c.dispatch_s
    if handoff:
        sc.detail["handoff_s"] = handoff
        sc.detail["handoff_bytes"] = moved
    if overlap:
        sc.detail["stream_overlap_s"] = overlap
    return sc


def _value_head(c: _Ctx, u: UnitPlan, sc: StageCost, train: bool) -> None:
    """The value head of a shared actor-critic trunk (h -> 1 per token): forward in the
    shared forward, forward+backward in the shared update, its weights + Adam state."""
    m, cal = c.model, c.calib
    passes = 3.0 if train else 1.0
    flops = passes * 2.0 * m.hidden * c.tokens
    n = u.num_devices
    tok_dev = min(c.tokens / n, c.max_seq * u.micro_batch_size)
    eff = c.gpu.matmul_eff(2.0 * tok_dev * m.hidden)
    factor = cal.train_eff_factor if train else cal.forward_eff_factor
    t = flops / (c.gpu.peak_flops(c.prec) * n * eff * factor)
    sc.time_s += t
    sc.flops += flops
    sc.detail["value_head_s"] = t
    head = m.hidden + 1
    sc.memory_gb["value_head"] = head * (c.wbytes + (2.0 + 12.0 if train else 0.0)) / GB


def price_unit(
    graph: Any,
    plan: Plan,
    unit: str,
    workload: Workload | Any,
    *,
    cluster: ClusterSpec | None = None,
    model: ModelSpec | None = None,
    calib: Calibration = DEFAULT,
) -> StageCost:
    """Price one execution unit on its own (time, FLOPs, bytes, comm, memory per device),
    without assembling the step or checking the device memory of its pool. Equal to
    ``predict(graph, plan, workload).stages[unit]``. Needs placements for ``unit`` and,
    for the weight sync, the generation and training units."""
    from rpeg import specs

    wl = workload if isinstance(workload, Workload) else Workload.from_config(workload)
    if cluster is None:
        cluster = specs.cluster(plan.cluster, num_nodes=plan.num_nodes)
    if model is None:
        model = specs.model(plan.model)
    c = _Ctx(plan, wl, cluster, model, calib)
    info = _graph_info(graph)
    members = dict(info["units"]).get(unit)
    if members is None:
        known = ", ".join(n for n, _ in info["units"])
        raise KeyError(f"no execution unit {unit!r} in the graph (units: {known})")
    gen_plan, train_plan = _gen_train_plans(plan, info["units"])
    return _price_unit(c, info, unit, members, gen_plan, train_plan)


# --- the step ---------------------------------------------------------------------------
def predict(
    graph: Any,
    plan: Plan,
    workload: Workload | Any,
    *,
    cluster: ClusterSpec | None = None,
    model: ModelSpec | None = None,
    calib: Calibration = DEFAULT,
    check_memory: bool = True,
) -> StepPrediction:
    """Predict one RL step of ``graph`` executed as ``plan`` on ``workload``.

    ``cluster``/``model`` default to the plan's catalog names (sized by ``plan.num_nodes``).
    Raises :class:`InfeasiblePlan` (reason memory/devices/divisibility) with the numbers.
    """
    from rpeg import specs

    wl = workload if isinstance(workload, Workload) else Workload.from_config(workload)
    if cluster is None:
        cluster = specs.cluster(plan.cluster, num_nodes=plan.num_nodes)
    if model is None:
        model = specs.model(plan.model)
    if model.unsupported:
        raise specs.SpecError(
            [f"model {model.name}: {model.unsupported}"], title="model not supported"
        )
    c = _Ctx(plan, wl, cluster, model, calib)
    info = _graph_info(graph)
    units = info["units"]
    # device checks
    for uname, _ in units:
        u = _unit_plan(plan, uname)
        if u.devices[-1] >= cluster.num_devices:
            raise InfeasiblePlan(
                "devices",
                f"uses device {u.devices[-1]} but cluster {cluster.name} has {cluster.num_devices} devices",
                unit=uname,
                device=u.devices[-1],
            )
    gen_plan, train_plan = _gen_train_plans(plan, units)
    pools = plan.colocated()
    pool_of = {n: i for i, g in enumerate(pools) for n in g}
    multi_pool = len({pool_of[n] for n, _ in units}) > 1
    async_overlap = plan.staleness >= 1 and multi_pool

    stages: dict[str, StageCost] = {}
    for uname, members in units:
        stages[uname] = _price_unit(c, info, uname, members, gen_plan, train_plan)

    # memory: co-resident units per pool
    cap = cluster.gpu.hbm_gb
    dev_mem: dict[str, float] = {}
    offload_s: dict[int, float] = {}
    for i, group in enumerate(pools):
        names = [n for n, _ in units if n in group]
        if not names:
            continue
        all_off = all(plan.units[n].offload for n in names) and len(names) > 1
        # weights of the same role are shared by its units on the same devices
        peaks = [stages[n].peak_memory_gb for n in names]
        if all_off:
            need = max(peaks)
            moved = 0.0
            critic = 0.0
            for n in names:
                mg = stages[n].memory_gb
                st = sum(v for k, v in mg.items() if k in ("weights", "gradients", "optimizer"))
                if "train_critic" in stages[n].kinds:
                    critic = max(critic, st)  # a separate critic's state moves as well
                else:
                    moved = max(moved, st)
            moved += critic
            offload_s[i] = (
                2 * 2 * moved * GB / (calib.host_link_gbps * GB)
            )  # out+in, train and gen roles
        else:
            need = sum(peaks) if len(names) > 1 else peaks[0]
            if len(names) > 1:
                need = max(peaks) + _resident_extra(stages, names)
        key = format_devices(_union_devices(tuple(plan.units[n].devices for n in names)))
        dev_mem[key] = need
        if check_memory and need > cap:
            worst = max(names, key=lambda n: stages[n].peak_memory_gb)
            raise InfeasiblePlan(
                "memory",
                f"needs {need:.1f} GB per device but {cluster.gpu.name} has {cap:.0f} GB "
                f"(largest: {worst} {stages[worst].peak_memory_gb:.1f} GB)",
                unit=worst,
                needed_gb=need,
                capacity_gb=cap,
                device=plan.units[worst].devices[0],
                breakdown=stages[worst].memory_gb,
            )

    # schedule
    timeline: list[TimelineRecord] = []
    pool_busy: dict[int, float] = {}
    if async_overlap:
        # steady state with bounded staleness: every pool works continuously, the slower
        # pool sets the step time (the bound k >= 1 lets the faster one run ahead).
        for uname, _ in units:
            i = pool_of[uname]
            s = pool_busy.get(i, 0.0)
            d = stages[uname].time_s
            timeline.append(_rec(stages[uname], s, s + d))
            pool_busy[i] = s + d
        step = max(pool_busy.values())
    elif multi_pool and plan.streaming:
        # k = 0 with streaming: the trainer consumes mini-batches as they are generated, so
        # only the last mini-batch's work follows the end of generation.
        t = 0.0
        gen_end = 0.0
        for uname, members in units:
            d = stages[uname].time_s
            kinds = {k for _, k, _ in members}
            if _GEN in kinds:
                timeline.append(_rec(stages[uname], t, t + d))
                gen_end = t + d
                t = gen_end
            else:
                share = d / max(1, wl.train_minibatches) if kinds & set(_TRAIN + _FWD) else d
                timeline.append(_rec(stages[uname], t - (d - share), t + share))
                t += share
        step = t
    else:
        t = 0.0
        for uname, _ in units:
            d = stages[uname].time_s
            timeline.append(_rec(stages[uname], t, t + d))
            t += d
        step = t
    extra = sum(offload_s.values()) + c.step_overhead_s
    step += extra
    if offload_s:
        timeline.append(
            TimelineRecord(
                "offload/reload", timeline[0].device_group, step - extra, step, kind="offload"
            )
        )

    ndev = plan.num_devices
    useful = sum(s.flops for s in stages.values())
    mfu = useful / (step * ndev * cluster.gpu.peak_flops(c.prec)) if step > 0 else 0.0
    return StepPrediction(
        step_s=step,
        stages=stages,
        num_devices=ndev,
        tokens_per_step=c.tokens,
        tokens_per_s_per_gpu=c.tokens / step / ndev if step > 0 else 0.0,
        mfu=mfu,
        timeline=timeline,
        device_memory_gb=dev_mem,
        capacity_gb=cap,
        assumptions=c.assumptions,
    )


@lru_cache(maxsize=4096)
def _union_devices(sets: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return sets[0] if len(set(sets)) == 1 else tuple(sorted({d for s in sets for d in s}))


_ROLE_OF_KIND = {
    "ref_logprob": "reference",
    "values": "critic",
    "train_critic": "critic",
}


def _unit_role(sc: StageCost) -> str:
    for k in sc.kinds:
        if k in _ROLE_OF_KIND:
            return _ROLE_OF_KIND[k]
    return "actor"


def _resident_extra(stages: dict[str, StageCost], names: list[str]) -> float:
    """Without offload, co-resident units of *other* models (reference, critic, reward
    model) keep their state on the device: their weights, and for a trained model (a
    separate critic) its optimizer state. Units of the same model share its weights and
    run one after another, so only the largest working set counts. With the actor's
    update the largest unit, the actor's optimizer state is in it; with the critic's, the
    actor's weights and optimizer state are the extra."""
    top = max(names, key=lambda n: stages[n].peak_memory_gb)
    top_role = _unit_role(stages[top])
    resident: dict[str, float] = {}
    for n in names:
        role = _unit_role(stages[n])
        if role == top_role:
            continue
        mg = stages[n].memory_gb
        if role == "actor" and not set(stages[n].kinds) & {"train_actor"}:
            continue  # the actor's other units: counted through its update below
        state = mg.get("weights", 0.0) + mg.get("optimizer", 0.0)
        resident[role] = max(resident.get(role, 0.0), state)
    return sum(resident.values())


def _merge(name: str, parts: list[StageCost], u: UnitPlan) -> StageCost:
    if len(parts) == 1:
        p = parts[0]
        p.name = name
        return p
    sc = StageCost(
        name, tuple(k for p in parts for k in p.kinds), format_devices(u.devices), u.num_devices
    )
    for p in parts:
        sc.time_s += p.time_s
        sc.flops += p.flops
        sc.hbm_bytes += p.hbm_bytes
        for k, v in p.comm_s.items():
            sc.comm_s[k] = sc.comm_s.get(k, 0.0) + v
        for k, v in p.memory_gb.items():
            sc.memory_gb[k] = max(sc.memory_gb.get(k, 0.0), v)
        for k, v in p.detail.items():
            sc.detail[f"{p.name}.{k}"] = v
    return sc


def _rec(sc: StageCost, start: float, end: float) -> TimelineRecord:
    return TimelineRecord(sc.name, sc.devices, start, end, kind=sc.kinds[0] if sc.kinds else "")
