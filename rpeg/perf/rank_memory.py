"""Peak memory of one rank as RPEG's runtime lays it out (pure).

The per-unit memory of :mod:`rpeg.perf.units` prices a unit the way published trainers hold
it (bf16 weights, fused kernels). This module prices what a rank of RPEG's own runtime holds,
part by part, from the compiled groups (``rpeg.compile.GroupSpec``: dp, tp, FSDP, recompute,
the roles and which train) -- what ``rpeg predict`` reports per rank, what the run summary
and ``rpeg bench`` set beside the measured peak, and what the preflight refuses before start
when it exceeds a worker's memory. docs/ranks.md "Where a rank's bytes live" walks
through it with the measured table.

Resident between units (``s`` = the role's shard divisor: tp, times dp under FSDP):

* a trained role: fp32 master weights ``4P/s`` and AdamW's two moments ``8P/s``;
* a frozen role (the reference, an actor that only generates): ``P/s`` in the compute dtype;
* a generator's own copy (a lagging torch engine, another generation tp): ``P/gen_tp``;
* the process itself (:data:`CPU_BASELINE_GB` on a CPU worker; the framework reserve on a GPU).

Transient, the largest of three phases:

* training: fp32 gradients ``4P/s`` (freed after the step's last update), FSDP's buffers
  (the whole model when it stays gathered from forward to backward; else
  :data:`FSDP_TRAIN_UNITS` gathered blocks: the one computing, the one prefetched, a block's
  unsharded gradients and the collectives' staging), and the micro-batch's activations: per token and layer
  :data:`ACT_FLOATS_WHOLE_PER_HIDDEN` ``x hidden`` whole on every tp rank plus
  (:data:`ACT_FLOATS_SPLIT_PER_HIDDEN` ``x hidden +`` :data:`ACT_FLOATS_PER_KV` ``x kv +``
  :data:`ACT_FLOATS_PER_FFN` ``x ffn``) / tp values kept for backward, or with
  recompute :data:`RECOMPUTE_FLOATS_PER_HIDDEN` ``x hidden`` per layer plus one layer's worth;
* generation (torch engine): under FSDP the whole model gathered for the decode loop when
  the layout keeps it gathered, else :data:`FSDP_FORWARD_UNITS` blocks (each forward gathers
  one unit at a time, the dp ranks in lockstep); the KV cache of the rank's rows;
* log-prob passes: :data:`FSDP_FORWARD_UNITS` blocks and the logits chunk.

A vLLM engine holds its weights and KV cache in its own process (its share of the device is
the plan's ``gpu_memory_utilization``), priced by :mod:`rpeg.perf.generation`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rpeg.perf.prediction import GB
from rpeg.plan.schema import PP_SCHEDULE_CHUNKS

#: activation values kept for backward per token and decoder layer, per unit of the hidden
#: size, of the MLP width and of the key/value width (kv heads x head dim) (a Hugging Face
#: Llama-style block, eager, SDPA attention): measured with
#: ``torch.autograd.graph.saved_tensors_hooks`` as the difference of 2- and 1-layer models,
#: the weights left out: 10.0 x hidden + 4.0 x MLP values exactly over 8 multi-head shapes
#: (hidden 256-1536, MLP 1024-6144, 4-16 heads); over 7 grouped-query shapes at tp 1 and 2
#: (benchmarks/bench_tp_activations.py, RPEG's tensor parallelism) 8.04 x hidden + 4.00 x
#: MLP + 2.00 x kv at tp 1 and 7.02 x hidden + 2.00 x MLP + 1.00 x kv at tp 2: 6 x hidden
#: (the layer norms' inputs and outputs, the residual stream) whole on every tp rank, the
#: rest split (docs/measurements.md)
ACT_FLOATS_WHOLE_PER_HIDDEN = 6.0
ACT_FLOATS_SPLIT_PER_HIDDEN = 2.0
ACT_FLOATS_PER_KV = 2.0
ACT_FLOATS_PER_FFN = 4.0
#: with every layer checkpointed: values kept per token and layer (its input and the
#: rotary tables' share), the same measurement with gradient checkpointing on
RECOMPUTE_FLOATS_PER_HIDDEN = 2.0
#: resident memory of a CPU rank before any model: the Python process with torch,
#: transformers, Dask's worker and the runtime imported (measured: 0.27 GB after the imports,
#: 0.42 GB at a rank's start inside a Dask worker; docs/measurements.md)
CPU_BASELINE_GB = 0.42
#: the shared memory of a same-host 2-rank channel (rpeg.runtime.pair_channel): two regions
#: of ``CHUNK_BYTES`` (16 MiB) written by the rank, two of its peer's mapped and read
PAIR_CHANNEL_GB = 4 * 16 * 2**20 / 1e9
#: FSDP's transient buffers in units of one gathered block (compute dtype), measured on the
#: 302M model at fsdp dp=2 (RSS high-water mark less the resident state, docs/measurements.md):
#: training 4.8 (the computing and the prefetched block, the block's unsharded gradients,
#: the gather and reduce-scatter staging), a forward-only pass 3.0
FSDP_TRAIN_UNITS = 5.0
FSDP_FORWARD_UNITS = 3.0
#: FSDP's unit: consecutive decoder blocks until this many bytes, and the block size past
#: which attention and MLP are units of their own (defined here, used by
#: rpeg.runtime.sharding: the runtime builds the units this prices)
FSDP_UNIT_BYTES = 25 * 2**20
FSDP_SPLIT_BYTES = 64 * 2**20
#: tokens of the chunked log-prob head (rpeg.runtime.model_io.logprobs)
LOGITS_CHUNK_TOKENS = 1024

_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True)
class RankMemory:
    """Predicted peak of each rank of one actor group: ``parts`` (GB) of the resident state
    and of the phase that sets the peak (``phase``: train, generate or logprob)."""

    group: str
    ranks: int
    parts: dict[str, float] = field(default_factory=dict)
    phase: str = ""

    @property
    def peak_gb(self) -> float:
        return sum(self.parts.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "ranks": self.ranks,
            "phase": self.phase,
            "peak_gb": self.peak_gb,
            "parts": dict(self.parts),
        }


def _params(model: Any) -> float:
    return float(model.params)


def _layer_params(model: Any) -> float:
    """Parameters of one decoder block (the matmuls; norms are negligible)."""
    emb = model.vocab * model.hidden * (1 if model.tied_embeddings else 2)
    return max(0.0, (_params(model) - emb) / max(1, model.layers))


def _unit_bytes(model: Any, cb: float, tp: int) -> float:
    """Bytes of the largest gathered FSDP unit: blocks grouped up to :data:`FSDP_UNIT_BYTES`
    (of the rank's fp32 masters), at least one block; a block past :data:`FSDP_SPLIT_BYTES`
    is split into its attention and MLP, and those into their matrices while past it (the
    largest counts)."""
    block = _layer_params(model) * 4.0 / tp
    if block > FSDP_SPLIT_BYTES:  # split into attention and MLP, their matrices past it
        mlp = 3.0 * model.hidden * model.ffn_hidden
        attn = _layer_params(model) - mlp
        parts = [
            p / (n if p * 4.0 / tp > FSDP_SPLIT_BYTES else 1) for p, n in ((mlp, 3), (attn, 4))
        ]
        return max(parts) * cb / tp
    per_unit = max(1, math.ceil(FSDP_UNIT_BYTES / block)) if block > 0 else 1
    return per_unit * _layer_params(model) * cb / tp


def activation_bytes(model: Any, tokens: float, cb: float, tp: int, recompute: bool) -> float:
    """Bytes a training micro-batch of ``tokens`` keeps for backward on one rank (module doc)."""
    kv = model.kv_heads * model.head_dim
    split = (
        ACT_FLOATS_SPLIT_PER_HIDDEN * model.hidden
        + ACT_FLOATS_PER_KV * kv
        + ACT_FLOATS_PER_FFN * model.ffn_hidden
    )
    per_layer = ACT_FLOATS_WHOLE_PER_HIDDEN * model.hidden + split / tp
    if recompute:
        kept = RECOMPUTE_FLOATS_PER_HIDDEN * model.hidden * model.layers
        return tokens * cb * (kept + per_layer)
    return tokens * cb * per_layer * model.layers


def kv_bytes(model: Any, rows: float, seq: float, cb: float, tp: int) -> float:
    """The torch engine's KV cache for ``rows`` sequences of ``seq`` tokens on one rank."""
    return rows * seq * model.kv_bytes_per_token(cb) / tp


def pipeline_chunks(schedule: str) -> int:
    """Model chunks per pipeline rank of a schedule (rpeg.plan.schema.PP_SCHEDULE_CHUNKS)."""
    return PP_SCHEDULE_CHUNKS.get(schedule, 1)


def stage_layers(layers: int, pp: int, r: int, chunks: int = 1) -> int:
    """Decoder layers pipeline rank ``r`` of ``pp`` holds: its chunks ``r, r + pp, ...`` of
    ``pp * chunks`` contiguous chunks whose sizes differ by at most one, the first chunks
    taking the remainder (rpeg.runtime.pipeline.split_layers)."""
    n = pp * chunks
    base, extra = divmod(layers, n)
    return sum(base + (1 if c < extra else 0) for c in range(r, n, pp))


def inflight_chunks(schedule: str, pp: int, m: float, r: int) -> float:
    """The most chunk-forwards pipeline rank ``r`` holds activations for at once, ``m``
    micro-batches per mini-batch (rpeg.runtime.pipeline's orders): gpipe all ``m``; 1F1B
    ``pp - r`` (its warm-up forwards and one more before the first backward); interleaved
    1F1B ``2 (pp - r - 1) + (v - 1) pp + 1`` chunk-forwards of ``v`` per micro-batch."""
    if pp <= 1:
        return 1.0
    v = pipeline_chunks(schedule)
    if schedule == "gpipe":
        return m
    if v == 1:
        return min(pp - r, m)
    return min(2 * (pp - r - 1) + (v - 1) * pp + 1, v * m)


def _stage_params(model: Any, pp: int, r: int, chunks: int, ep: int) -> float:
    """Parameters pipeline rank ``r`` holds before tp/FSDP sharding: its decoder layers (the
    routed experts over ``ep``), the embedding on the first rank, the final norm and LM head on
    the last (a tied embedding is held twice at pp > 1: rpeg.runtime.pipeline)."""
    P, E = _params(model), float(model.routed_expert_params)
    emb = float(model.vocab * model.hidden)
    head = 0.0 if model.tied_embeddings else emb
    if pp <= 1:
        return P - E + E / ep
    share = stage_layers(model.layers, pp, r, chunks) / max(1, model.layers)
    blocks = P - E - emb - head
    out = share * (blocks + E / ep)
    if r == 0:
        out += emb
    if r == pp - 1:
        out += emb  # the LM head, or the tied embedding's second copy
    return out


def rank_memory(
    groups: Iterable[Any],
    model: Any,
    wl: Any,
    *,
    train_micro_batch: Mapping[str, int],
    staleness: int,
    baseline_gb: float | None = None,
) -> list[RankMemory]:
    """The predicted peak of a rank of each compiled group (module doc): the largest over
    the group's pipeline ranks. ``wl``: the perf Workload; ``train_micro_batch``: group ->
    its training unit's micro-batch size (samples); ``staleness``: the compiled bound (a
    trained torch generator keeps a lagging copy when > 0); ``baseline_gb``: the process's
    own (None: :data:`CPU_BASELINE_GB` on CPU, the framework reserve ``1.0`` GB on a GPU)."""
    out = []
    for g in groups:
        pp = max(1, int(getattr(g, "pp", 1) or 1))
        ranks = [
            _pipeline_rank_memory(g, r, model, wl, train_micro_batch, staleness, baseline_gb)
            for r in range(pp)
        ]
        parts, phase = max(ranks, key=lambda pr: sum(pr[0].values()))
        out.append(RankMemory(g.name, int(g.world_size), parts, phase))
    return out


def _pipeline_rank_memory(
    g: Any,
    r: int,
    model: Any,
    wl: Any,
    train_micro_batch: Mapping[str, int],
    staleness: int,
    baseline_gb: float | None,
) -> tuple[dict[str, float], str]:
    """(parts, peak phase) of a rank of group ``g`` at pipeline rank ``r``. At pp > 1 a rank
    holds its stage's parameters, keeps activations for :func:`inflight_chunks` chunk-forwards
    of its layers, and only the last stage computes logits; at cp > 1 a micro-batch's tokens
    are split over cp (the gathered keys and values of each layer are kept whole); at ep > 1 a
    rank holds ``1/ep`` of the routed experts."""
    P = _params(model)
    samples = float(wl.num_prompts * wl.samples_per_prompt)
    seq = float(wl.max_prompt_tokens + wl.max_response_tokens)
    cb = _DTYPE_BYTES.get(str(g.dtype), 4.0)
    tp, dp = max(1, g.tp), max(1, g.dp)
    pp = max(1, int(getattr(g, "pp", 1) or 1))
    cp = max(1, int(getattr(g, "cp", 1) or 1))
    ep = max(1, int(getattr(g, "ep", 1) or 1))
    schedule = str(getattr(g, "pp_schedule", "1f1b"))
    v = pipeline_chunks(schedule) if pp > 1 else 1
    last = r == pp - 1
    # FSDP shards over the dp x cp ranks at cp (rpeg.runtime.context_parallel.context_fsdp)
    fsdp_ranks = dp * (cp if pp == 1 else 1)
    fsdp = bool(g.fsdp) and fsdp_ranks > 1
    s = tp * (fsdp_ranks if fsdp else 1)
    Pr = _stage_params(model, pp, r, v, ep)
    layers_r = stage_layers(model.layers, pp, r, v) if pp > 1 else model.layers
    cpu = str(g.device_type) == "cpu"
    base = baseline_gb if baseline_gb is not None else (CPU_BASELINE_GB if cpu else 1.0)
    roles, trained = set(g.roles), set(g.trainable)
    res: dict[str, float] = {"process": base}
    if cpu and 2 in (dp, tp, fsdp_ranks if fsdp else 0):  # a same-host pair's shared-memory channel
        res["pair_channel"] = PAIR_CHANNEL_GB
    if "actor" in roles:
        if "actor" in trained:
            res["actor_weights"] = 4.0 * Pr / s / GB
            res["actor_optimizer"] = 8.0 * Pr / s / GB
        else:
            res["actor_weights"] = cb * Pr / s / GB
    if "reference" in roles:
        res["reference"] = cb * Pr / (s if (fsdp or tp > 1) else 1) / GB
    head = 0.0 if (pp > 1 and not last) else model.vocab * model.hidden
    critic_p = Pr - (0 if model.tied_embeddings and pp == 1 else head)
    if "critic" in roles:
        res["critic_weights"] = 4.0 * critic_p / s / GB
        res["critic_optimizer"] = 8.0 * critic_p / s / GB
    gen_tp = max(1, getattr(g, "gen_tp", tp) or tp)
    generates = getattr(g, "gen_engine", None) not in (None, "vllm") and "actor" in roles
    own_copy = generates and (
        gen_tp != tp
        or pp > 1
        or (cp > 1 and not fsdp)  # under FSDP x cp the engine decodes on the actor's shards
        or ("actor" in trained and staleness > 0 and not fsdp and tp == 1)
    )
    if own_copy:
        res["generator_copy"] = cb * P / gen_tp / GB
    phases: dict[str, dict[str, float]] = {}
    unit = _unit_bytes(model, cb, tp) if fsdp else 0.0
    if trained:
        rows = samples / dp / max(1, wl.train_minibatches)
        mbs = min(float(train_micro_batch.get(g.name, rows) or rows), rows)
        m = max(1, math.ceil(rows / mbs)) if mbs > 0 else 1
        trained_p = (Pr if "actor" in trained else 0.0) + (critic_p if "critic" in trained else 0.0)
        # gradients live from the first backward to the step's last update (then freed)
        t = {"gradients": 4.0 * trained_p / s / GB}
        if fsdp:
            keep = not getattr(g, "reshard_after_forward", True)
            t["gathered"] = (cb * Pr / tp + 2 * unit if keep else FSDP_TRAIN_UNITS * unit) / GB
        tokens = mbs * seq / cp
        recompute = bool(getattr(g, "recompute", False))
        per_chunk = activation_bytes(model, tokens, cb, tp, recompute) * (
            layers_r / v / max(1, model.layers)
        )
        if cp > 1:  # each layer's keys and values gathered over cp, kept for backward
            kv = model.kv_bytes_per_token(cb) / max(1, model.layers) / tp
            per_chunk += mbs * seq * kv * layers_r / v
        t["activations"] = inflight_chunks(schedule, pp, m, r) * per_chunk / GB
        if last:
            t["logits"] = min(tokens, LOGITS_CHUNK_TOKENS) * model.vocab * 4.0 * 2 / tp / GB
        phases["train"] = t
    if generates:
        gen_dp = max(1, g.world_size // gen_tp)
        rows = samples / gen_dp
        gen = {"kv_cache": kv_bytes(model, rows, seq, cb, gen_tp) / GB}
        if fsdp and not own_copy:
            # kept gathered for the decode loop, or one unit at a time in lockstep
            # (rpeg.runtime.roles.PolicyWorker._decoding)
            keep = not getattr(g, "reshard_after_forward", True)
            gen["gathered"] = (cb * P / tp if keep else FSDP_FORWARD_UNITS * unit) / GB
        gen["logits"] = rows * model.vocab * 4.0 / GB
        phases["generate"] = gen
    if roles & {"reference", "actor", "critic"}:
        rows = samples / dp
        tok = min(rows * seq / cp, LOGITS_CHUNK_TOKENS)
        phases["logprob"] = {
            "gathered": FSDP_FORWARD_UNITS * unit / GB,
            "logits": (tok * model.vocab * 4.0 / tp if last else 0.0) / GB,
        }
    phase, extra = max(phases.items(), key=lambda kv: sum(kv[1].values()), default=("", {}))
    return {**res, **{f"{phase}:{k}": v for k, v in extra.items()}}, phase


def parse_size_gb(text: str) -> float | None:
    """GB of a size such as ``8GiB``, ``12GB``, ``500MB`` (None for ``auto`` and ``0``)."""
    t = str(text).strip()
    if t in ("auto", "0", ""):
        return None
    units = {"": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20}
    units.update({"g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40})
    num = t.rstrip("BbIiKkMmGgTt ")
    unit = t[len(num) :].strip().lower()
    try:
        value = float(num)
    except ValueError:
        value = None
    if unit not in units or value is None:
        raise ValueError(f"{text!r}: expected a size such as 8GiB")
    return value * units[unit] / GB
