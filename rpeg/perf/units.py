"""The per-plan context every unit's cost shares, and the layout rules a training unit's cost
and memory rest on: recompute, FSDP's gathered parameters, parameters per device (pure). The
cost of a forward-only or training pass, term by term: :mod:`rpeg.perf.passes`; generation and
weight sync: :mod:`rpeg.perf.generation`; the step assembly: :mod:`rpeg.perf.pricing`; every
equation is in docs/perf-model.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rpeg.perf import costs, turns
from rpeg.perf.calibration import Calibration
from rpeg.perf.lengths import LengthDist, code_scaled, prior_mean
from rpeg.perf.prediction import GB, Workload
from rpeg.plan.schema import InfeasiblePlan, Plan, UnitPlan
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
        if calib.fitted_collective_latency_s is not None:  # measured on this machine
            cluster = replace(cluster, collective_latency_s=calib.fitted_collective_latency_s)
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
            mean = prior_mean(kind, cap, calib, domain=wl.task_domain)
            task = " on code" if code_scaled(kind, wl.task_domain) else ""
            self.assumptions.append(
                f"mean response length unpublished: assumed {mean:.0f} tokens (prior of "
                f"{kind} models{task} at a {cap:.0f}-token cap)"
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


# --- the layout rules of a training unit --------------------------------------------------
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


def layer_activation_bytes_per_hidden(cal: Calibration, tp: int, seq_parallel: bool) -> float:
    """Bytes per token and hidden unit one rank keeps of one layer's activations for backward:
    the tensor-parallel regions' share split over ``tp``, the rest (layer-norm inputs,
    dropout masks) whole on every tp rank unless ``seq_parallel`` splits it too (Korthikanti
    et al. 2022: ``10 + 24/t`` without, ``34/t`` with sequence parallelism)."""
    if seq_parallel:
        return cal.act_bytes_per_hidden_full / tp
    rep = cal.act_bytes_per_hidden_replicated
    return (cal.act_bytes_per_hidden_full - rep) / tp + rep


def full_activation_bytes(
    m: ModelSpec,
    tok_dev: float,
    tp: int,
    pp: int,
    in_flight: float,
    cal: Calibration,
    seq_parallel: bool = False,
) -> float:
    """Bytes of the activations one rank keeps for backward without recompute: ``tok_dev``
    tokens of a micro-batch through its ``layers / pp`` layers, ``in_flight`` micro-batches
    (a pipeline holds up to ``pp``)."""
    per = layer_activation_bytes_per_hidden(cal, tp, seq_parallel)
    return tok_dev * m.hidden * per * (m.layers / pp) * in_flight


def params_per_device(m: ModelSpec, tp: int, pp: int, ep: int) -> float:
    """Parameters one rank of a ``tp x pp`` (``ep`` for experts) layout holds unsharded."""
    expert_all = m.routed_expert_params
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
