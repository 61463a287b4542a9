"""Rollout-engine units (pure): generation (prefill + continuous-batching decode with its
long tail, or an asynchronous engine's steady state) and the weight sync from the trainer
into the engine. The per-plan context and the other units live in :mod:`rpeg.perf.units`;
every equation is in docs/perf-model.md ("Equations")."""

from __future__ import annotations

import math
from typing import Any

from rpeg.perf import costs, eager_cpu
from rpeg.perf.as_run import torch_engine
from rpeg.perf.passes import collective_latency
from rpeg.perf.prediction import GB, StageCost
from rpeg.perf.units import GEN_KIND, UnitContext
from rpeg.plan.schema import InfeasiblePlan, UnitPlan, format_devices


# --- generation -------------------------------------------------------------------------
def prefill_time(
    c: UnitContext, u: UnitPlan, tokens: float, seq_sq: float, extra_flops: float = 0.0
) -> tuple[float, float]:
    """(seconds, FLOPs) of one replica's compute-bound prefill of ``tokens`` tokens whose
    attention spans ``seq_sq`` (the sum of squared context lengths), plus ``extra_flops``."""
    m = c.model
    flops = costs.forward_flops(m, tokens, seq_sq) / (u.tp * u.pp) + extra_flops
    gemm = 2.0 * min(tokens, 8192) * m.hidden * max(m.ffn_hidden, m.attn_width) / u.tp
    return flops / (c.peak_flops * c.gpu.matmul_eff(gemm) * c.calib.train_eff_factor), flops


def static_engine(u: UnitPlan, gpu: Any) -> bool:
    """Whether the unit decodes with RPEG's torch engine (:func:`rpeg.perf.as_run.torch_engine`):
    one static batch of the rank's rows, every row computed until the longest ends
    (rpeg.runtime.engines.torch_engine masks finished rows, it does not drop them). ``auto``
    on accelerators is priced as a continuous-batching engine, as the published systems run
    (vLLM, SGLang)."""
    return torch_engine(u, cuda=not eager_cpu.is_cpu(gpu))


def spec_accept_len(wl: Any, cal: Any) -> float:
    """Mean tokens a decode step advances a sequence by: 1 without speculative decoding;
    the workload's published acceptance length; else the prior 1 + r + ... + r^k (each of
    the k drafts accepted with ``Calibration.spec_accept_rate`` given the previous one). A
    sequence advances by at most the tokens a verification runs (a draft tree's width,
    else the chain's 1 + k)."""
    k = wl.spec_draft_tokens
    if not k:
        return 1.0
    most = min(1 + k, spec_verify_tokens(wl))
    if wl.spec_accept_len is not None:
        return min(max(1.0, wl.spec_accept_len), most)
    r = cal.spec_accept_rate
    return sum(r**i for i in range(most))


def spec_verify_tokens(wl: Any) -> int:
    """Tokens per sequence one verification runs: a draft tree's width where the workload
    states it (SGLang's ``speculative_num_draft_tokens``), else the chain's 1 + k."""
    return wl.spec_verify_tokens or 1 + wl.spec_draft_tokens


def ep_decode_s(c: UnitContext, u: UnitPlan, forwards: float, batch: float) -> float:
    """Decoding on weights whose experts are split over ``u.ep`` ranks (a generate unit on
    an ep training group's weights: rpeg.runtime.expert_parallel): every forward -- the
    prefill and each decode step -- dispatches each MoE layer's tokens to the experts' ranks
    and combines them, in lockstep with the other ranks: per MoE layer, the device's fixed
    dispatch cost (``GPUSpec.ep_layer_overhead_s``) and the two all-to-alls of ``batch``
    tokens' top-k hidden states."""
    m = c.model
    nbytes = batch * m.moe.top_k * m.hidden * c.wbytes
    ta, _ = costs.alltoall_time(nbytes, u.ep, c.cluster, u.devices[0], u.tp, c.calib.nccl_bus_eff)
    return forwards * m.moe_layers * (c.gpu.ep_layer_overhead_s + 2.0 * ta)


def generation_cost(c: UnitContext, u: UnitPlan, name: str, throughput_mode: bool) -> StageCost:
    m, gpu, cal = c.model, c.gpu, c.calib
    tp, pp = u.tp, u.pp
    replica = tp * pp
    replicas = u.num_devices // replica
    first = u.devices[0]
    sc = StageCost(name, (GEN_KIND,), format_devices(u.devices), u.num_devices)
    w_dev = m.params * c.wbytes / replica
    budget = u.gpu_memory_utilization * gpu.usable_hbm_gb * GB
    # the engine's cap on sequences in flight: the run's where it sets one
    max_seqs = c.wl.gen_max_seqs or cal.max_num_seqs
    act_reserve = 1.0 * GB + 2.0 * max_seqs * m.vocab * 4 / tp / 16  # logits/sampling buffers
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
    # a live sequence's mean context (length-biased: P + E[L^2]/(2E[L])) is what each decode
    # step reads; admission keeps room for a whole average sequence (P + E[L]), which also
    # stands for vLLM's preemptions at a full cache (docs/perf-model.md, "Equations")
    live_ctx = c.P + L.second_moment() / (2 * L.mean)
    b_kv = kv_tokens / (c.P + L.mean)
    b_max = max(1.0, min(max_seqs, b_kv))

    k = c.wl.spec_draft_tokens
    accept = spec_accept_len(c.wl, cal)
    verify = spec_verify_tokens(c.wl)
    topk = c.wl.spec_topk
    # a GPU decode without CUDA graphs: the plan's enforce_eager, or RPEG's torch engine (a
    # CPU device's eager cost is its own profile: rpeg.perf.eager_cpu)
    eager = not eager_cpu.is_cpu(gpu) and (u.enforce_eager or static_engine(u, gpu))

    # a draft pass (an MTP module or EAGLE head): one decoder layer and a projection onto the
    # vocabulary, as shares of a single-token step's device work
    draft_share = 1.0 / m.layers + m.vocab * m.hidden / max(1, m.matmul_params)

    def step(b: float, ctx: float) -> tuple[float, float, float, float]:
        """One decode step, per token it advances a sequence by (speculative decoding: a
        verification of ``verify`` tokens -- 1 + k for a chain, a draft tree's width -- and k
        sequential draft passes of ``topk`` candidates a sequence, each one layer and the
        vocabulary projection on the device plus ``Calibration.draft_pass_overhead_s`` -- vLLM
        runs each draft position as a forward of its own -- advancing ``accept`` tokens)."""
        ts, f1, b1, cm = costs.decode_step_time(
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
            verify=float(verify),
            eager=eager,
        )
        if k:
            one, f0, b0, _ = costs.decode_step_time(
                m, gpu, c.cluster, batch=b, context=ctx, tp=tp, pp=pp, first_device=first,
                wbytes=c.wbytes, kvbytes=c.kvbytes, calib=cal, precision=c.prec,
                verify=float(topk), eager=eager,
            )  # fmt: skip
            device = max(0.0, one - costs.decode_host_s(b, cal))
            ts += k * (draft_share * device + cal.draft_pass_overhead_s)
            f1, b1 = f1 + k * draft_share * f0, b1 + k * draft_share * b0
        return ts / accept, f1 / accept, b1 / accept, cm / accept

    t = fl = by = comm = 0.0
    # prefill of all prompts (compute-bound)
    vision = c.vision_fwd_flops / c.N * S / replica  # the vision tower on S samples' images
    t_pf, pf_flops = prefill_time(c, u, S * c.P, S * c.P * c.P, vision)
    t += t_pf
    fl += pf_flops
    if throughput_mode:
        # Steady state of an asynchronous engine (partial rollout): always b_eff sequences in
        # flight, no per-step tail. Cost = tokens / (b_eff tokens per step).
        b_eff = min(b_max, S * (1 + c.plan.staleness))
        ctx = live_ctx
        ts, f1, b1, cm = step(b_eff, ctx)
        n_steps = S * L.mean / b_eff
        forwards = n_steps / accept
        t += n_steps * ts
        fl += n_steps * f1
        by += n_steps * b1
        comm += n_steps * cm
        # the weight update of every step interrupts the b_eff live sequences: their KV cache
        # (old weights) is dropped and prompt + partial response re-prefilled on resume
        # (AReaL's interruptible rollout, Fu et al. 2025 Sec. 4; aborted-and-resumed requests
        # after a prefix-cache reset in verl's fully-async partial rollout). A live
        # sequence's context is P + E[L^2]/(2E[L]) (length-biased, uniform progress).
        re_tok = b_eff * ctx
        re_fl = costs.forward_flops(m, re_tok, b_eff * ctx * ctx) / replica
        re_gemm = 2.0 * min(re_tok, 8192) * m.hidden * max(m.ffn_hidden, m.attn_width) / tp
        t_re = re_fl / (c.peak_flops * gpu.matmul_eff(re_gemm) * cal.train_eff_factor)
        t += t_re
        fl += re_fl
        sc.detail.update(batch=b_eff, decode_steps=n_steps, reprefill_s=t_re, live_context=ctx)
    elif c.wl.gen_static_batch or static_engine(u, gpu):
        # static batches: ceil(S / b) batches, each b sequences decoded until the longest of
        # its b responses ends (a finished sequence is padding, still computed); RPEG's torch
        # engine decodes all of a rank's rows as one such batch, and the step waits for the
        # rank whose batch holds the longest of all the unit's rows
        b = max(1, min(int(c.wl.gen_static_batch or math.ceil(S)), math.ceil(S)))
        batches = math.ceil(S / b)
        lmax = L.expected_max(b if c.wl.gen_static_batch else max(1, round(c.N)))
        K = 12
        seg = lmax / K
        one = 0.0
        for i in range(K):
            ts, f1, b1, cm = step(b, c.P + (i + 0.5) * seg)
            one += seg * ts
            fl += batches * seg * f1
            by += batches * seg * b1
            comm += batches * seg * cm
        t += batches * one
        forwards = batches * lmax / accept
        sc.detail.update(batch=b, static_batches=batches, longest_response=lmax)
    else:
        lmax = L.expected_max(c.N)
        bulk = 0.0
        if b_max < S:
            # continuous batching: the first S - b_max sequences stream through a full batch
            ctx = live_ctx
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
        forwards = ((n_steps if b_max < S else 0.0) + lmax) / accept
        sc.detail.update(batch=min(S, b_max), longest_response=lmax, tail_s=tail, bulk_s=bulk)
    if u.ep > 1 and m.moe is not None:
        ep_s = ep_decode_s(c, u, forwards + 1.0, min(S, b_max))  # + the prefill
        t += ep_s
        comm += ep_s
        sc.detail.update(ep_dispatch_s=ep_s)
    level = c.cluster.span_level_contiguous(first, tp) if tp > 1 else "device"
    sc.time_s = eager_cpu.scaled(gpu, t - comm, comm, cal.gen_eff_scale)
    sc.flops = fl * replica * replicas
    sc.hbm_bytes = by * replica * replicas
    sc.comm_s = {level: comm} if comm else {}
    sc.detail.update(
        prefill_s=t_pf,
        prefill_flops=pf_flops,
        kv_capacity_tokens=kv_tokens,
        replicas=replicas,
        seqs_per_replica=S,
    )
    return sc


# --- weight sync ------------------------------------------------------------------------
def weight_sync_cost(
    c: UnitContext, name: str, u: UnitPlan, gen: UnitPlan | None, train: UnitPlan | None
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
    # a stack that measured its per-tensor hand-off (rpeg's CPU runtime) prices by that;
    # a GPU stack moves the whole model in the HF layout to every engine rank
    t_tensor = c.cluster.refit_tensor_s
    if same and c.cluster.reuses_rollout_logprobs:
        # one process holds the training model and the generator (rpeg's CPU runtime): at
        # k = 0 the generator IS the training model (a version bump, no copy) unless the
        # generator keeps its own copy (the trainer split into pipeline stages, or another
        # tp: rpeg.runtime.roles); otherwise the copy is refreshed in process (read + write
        # of the weights at memory speed), a pipelined trainer's tensors each broadcast from
        # the stage holding it over the pipeline group first
        # (rpeg.runtime.pipeline.pipeline_weight_source)
        own_copy = train is not None and (train.pp > 1 or train.tp != gen.tp)
        if c.plan.staleness == 0 and not own_copy:
            sc.detail.update(in_process=1.0, refit_bytes_s=0.0, refit_tensors_s=0.0)
            return sc
        t = 2.0 * gen_shard / c.gpu.hbm_bytes_per_s
        t_tensors = m.hf_tensors * (t_tensor or 0.0)
        if train is not None and train.pp > 1:
            link = c.cluster.link("domain")
            per_call = collective_latency(c, link.latency_s)
            t_stages = m.hf_tensors * per_call + m.params * c.wbytes / (
                link.bytes_per_s * cal.nccl_bus_eff
            )
            t += t_stages
            sc.comm_s = {"domain": t_stages}
            sc.detail.update(stage_broadcasts_s=t_stages)
        sc.time_s = t + t_tensors
        sc.detail.update(in_process=1.0, refit_bytes_s=t, refit_tensors_s=t_tensors)
        sc.hbm_bytes = 2.0 * gen_shard * gen.num_devices
        return sc
    if same:
        link = c.cluster.link("domain")
        lvl = "domain"
    else:
        allv = tuple(sorted(set(gen.devices) | set(train.devices if train else ())))
        lvl = c.cluster.span_level(allv)
        link = c.cluster.link(lvl)
    t = gen_shard / (link.bytes_per_s * cal.nccl_bus_eff) + 2 * m.layers * link.latency_s
    if t_tensor is not None:
        t_tensors = m.hf_tensors * t_tensor
        sc.detail.update(refit_tensors_s=t_tensors, hf_tensors=m.hf_tensors)
    else:
        t_tensors = export_gb(m, c.wl.precision) * cal.refit_s_per_gb
        sc.detail.update(refit_export_s=t_tensors)
    sc.time_s = t + t_tensors
    sc.detail.update(refit_bytes_s=t)
    sc.comm_s = {lvl: t}
    sc.hbm_bytes = gen_shard * gen.num_devices
    return sc


def export_gb(model: object, precision: str) -> float:
    """GB of the model's weights in the HF layout a refit hands over: bf16 (fp8 rollouts
    quantize on load), fp32 for an fp32 run."""
    return model.params * (4.0 if precision == "fp32" else 2.0) / GB  # type: ignore[attr-defined]
