"""Blank layout fields of a described run, solved rather than defaulted.

A published run (or a user's half-specified plan) may leave the generation TP, the training
TP or the split of a disaggregated job into generation and training pools unstated. Pricing
them at a fixed default is wrong in both directions (a 32B model at TP=1 on 64 GPUs is 8x too
slow; a 70B model at TP=1 does not fit). Here every open field takes the value a planner
would choose under the row's other constraints: among the values the hardware and the
architecture allow (TP divides the attention heads and the pool, stays inside one 8-GPU
NVLink group; pool sizes in whole nodes), the feasible combination with the shortest
predicted step. The search is a few dozen ``predict`` calls (pure, ~1 ms each), no optimizer
import: rpeg.perf stays below rpeg.search. Used by the validation of the model
(:mod:`rpeg.perf.validation.rows`: a row's blank fields).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from rpeg import defaults
from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.perf.prediction import StepPrediction
from rpeg.perf.pricing import predict
from rpeg.plan.schema import InfeasiblePlan

# Largest TP group a solved generation layout tries (models too large for one 8-GPU node,
# e.g. DeepSeek-V3 in bf16, need generation TP across nodes; the least-parallel rule below
# keeps the rest inside a node). A solved *training* TP stays inside one NVLink domain:
# Megatron-style trainers add pipeline stages across nodes (``solve_row``), none runs its
# per-layer all-reduces over the network.
MAX_SOLVED_TP = 64
# Generation share of a disaggregated job tried when the split is unpublished.
GEN_SHARES = (0.25, 1 / 3, 0.5, 2 / 3, 0.75)
# Among layouts whose predicted step is within this share of the fastest, the one with the
# least model parallelism is chosen (what practitioners pick: the smallest TP that does the
# job; more TP costs GPUs per replica for a marginal gain).
NEAR_FASTEST = 0.1


@dataclass(frozen=True)
class RowLayout:
    """The layout a published row describes: its pools, parallel sizes, KV budget and
    recompute, a field left blank (None) open until :func:`solve_layout` fills it. Not the
    planner's per-unit settings (:class:`rpeg.search.space.Layout`) nor a rank layout
    (``rpeg.runtime.mesh.Layout``)."""

    gen_gpus: int | None
    train_gpus: int | None
    gen_tp: int | None
    gen_pp: int = 1
    train_tp: int | None = 1
    train_pp: int = 1
    train_cp: int = 1
    train_ep: int | None = 1
    gpu_memory_utilization: float | None = defaults.GPU_MEMORY_UTILIZATION
    recompute: bool | None = True
    # pipeline stages of a critic on its own pool (``RowCase.critic_gpus``); None = the
    # trainer's (``train_pp``)
    critic_pp: int | None = None
    solved: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def open_fields(self) -> tuple[str, ...]:
        return tuple(k for k in SOLVABLE if getattr(self, k) is None)


SOLVABLE = (
    "gen_gpus",
    "train_gpus",
    "gen_tp",
    "train_tp",
    "train_ep",
    "gpu_memory_utilization",
    "recompute",
)
# KV budget shares tried for an engine whose gpu_memory_utilization is unpublished (the range
# of published RL recipes: NeMo-RL 0.3-0.8, verl 0.5-0.8; vLLM's default 0.9).
UTIL_CANDIDATES = (0.6, 0.8, 0.9)


def _tp_candidates(heads: int, pool: int, other: int, most: int = MAX_SOLVED_TP) -> list[int]:
    out = []
    t = 1
    while t <= most:
        if heads % t == 0 and pool % (t * other) == 0:
            out.append(t)
        t *= 2
    return out or [1]


def _ep_candidates(model: Any, dp: int) -> list[int]:
    """Expert-parallel sizes of a MoE trainer: powers of two dividing the experts and the
    trainer's data-parallel ranks (Megatron carves EP out of DP)."""
    experts = model.moe.experts if model.moe is not None else 1
    out, e = [], 1
    while e <= max(1, dp):
        if experts % e == 0 and dp % e == 0:
            out.append(e)
        e *= 2
    return out or [1]


def _split_candidates(n: int, node: int) -> list[int]:
    step = node if n >= 2 * node else 1
    out = set()
    for s in GEN_SHARES:
        g = int(round(n * s / step)) * step
        if 0 < g < n:
            out.add(g)
    return sorted(out) or [max(1, n // 2)]


def _gen_candidates(case: Any, pool: int, domain: int) -> list[tuple[int, int]]:
    """(tp, pp) of the rollout engine: the row's, else the TP sizes of :func:`_tp_candidates`
    at its pipeline size; a model whose weights no TP inside one NVLink domain fits (a
    405B or 671B model on 8-GPU nodes) may also take TP within the domain times pipeline
    stages across nodes (vLLM's multi-node guidance: TP the GPUs of a node, PP the nodes)
    where the row leaves ``gen_pp`` blank (``case.gen_pp_open``)."""
    lay, m = case.layout, case.model
    if lay.gen_tp is not None:
        return [(lay.gen_tp, lay.gen_pp)]
    out = [(t, lay.gen_pp) for t in _tp_candidates(m.heads, pool, lay.gen_pp)]
    if not getattr(case, "gen_pp_open", False):
        return out
    from rpeg import specs

    inside = _tp_candidates(m.heads, pool, 1, domain)
    hbm = specs.cluster(case.cluster_name).gpu.hbm_gb * 1e9
    wbytes = 1.0 if case.workload.precision == "fp8" else 2.0
    if m.params * wbytes / max(inside) <= max(UTIL_CANDIDATES) * hbm:
        return out  # a node holds it: no pipeline assumed
    return out + [(t, p) for t in inside for p in fit_pp(pool // t, m.layers) if pool % t == 0]


def candidates(case: Any) -> list[RowLayout]:
    """Every full layout the open fields of ``case.layout`` allow."""
    from rpeg import specs

    lay = case.layout
    heads = case.model.heads
    cluster = specs.cluster(case.cluster_name)
    node = cluster.gpus_per_node
    splits = (
        [(lay.gen_gpus, lay.train_gpus)]
        if lay.gen_gpus is not None
        else [(g, case.num_gpus - g) for g in _split_candidates(case.num_gpus, node)]
    )
    out = []
    for g, t in splits:
        # an engine on the trainer's shards has no layout of its own (set per trainer TP below)
        tied = getattr(case, "gen_from_trainer", False)
        gens = [(0, 0)] if tied else _gen_candidates(case, g, cluster.domain_size)
        if lay.train_tp is not None:
            ttp = [lay.train_tp]
        elif case.engine == "fsdp":
            ttp = [1]  # FSDP shards the weights; published FSDP recipes rarely add TP
        else:
            # within one NVLink domain (a node; a GB200 NVL72 rack)
            ttp = _tp_candidates(heads, t, lay.train_pp * lay.train_cp, cluster.domain_size)
        utils = (
            UTIL_CANDIDATES if lay.gpu_memory_utilization is None else (lay.gpu_memory_utilization,)
        )
        recs = (False, True) if lay.recompute is None else (lay.recompute,)
        for (a, gpp), b, u, rc in itertools.product(gens, ttp, utils, recs):
            if tied:  # the trainer's TP, and its stages unless resharded
                a, gpp = b, 1 if case.gen_reshard else lay.train_pp
            eps = (
                [lay.train_ep]
                if lay.train_ep is not None
                else _ep_candidates(case.model, t // (b * lay.train_pp * lay.train_cp))
            )
            for e in eps:
                out.append(
                    replace(
                        lay,
                        gen_gpus=g,
                        train_gpus=t,
                        gen_tp=a,
                        gen_pp=gpp,
                        train_tp=b,
                        train_ep=e,
                        gpu_memory_utilization=u,
                        recompute=rc,
                    )
                )
    return out


def solve_layout(case: Any, calib: Calibration = DEFAULT) -> tuple[RowLayout, StepPrediction]:
    """The fastest feasible full layout for ``case`` and its prediction; ``RowLayout.solved``
    names every field that was open and the value chosen. Raises the last InfeasiblePlan
    when no candidate fits."""
    open_fields = case.layout.open_fields
    ok: list[tuple[RowLayout, StepPrediction]] = []
    last: Exception | None = None
    for lay in candidates(case):
        try:
            pred = predict(case.graph, case.plan(lay), case.workload, calib=calib)
        except (InfeasiblePlan, ValueError) as exc:  # does not fit / does not divide
            last = exc
            continue
        ok.append((lay, pred))
    if not ok:
        assert last is not None
        raise last
    fastest = min(p.step_s for _, p in ok)
    near = [x for x in ok if x[1].step_s <= fastest * (1 + NEAR_FASTEST)]
    lay, pred = min(
        near,
        key=lambda x: (
            x[0].gen_tp * x[0].gen_pp * x[0].train_tp * (x[0].train_ep or 1),
            x[1].step_s,
        ),
    )
    solved = {k: getattr(lay, k) for k in open_fields}
    if lay.gen_pp != case.layout.gen_pp:
        solved["gen_pp"] = lay.gen_pp
    if solved:
        pred.assumptions.append(
            "layout fields not given, solved (fastest feasible): "
            + ", ".join(f"{k}={v}" for k, v in solved.items())
        )
    return replace(lay, solved=solved), pred


#: pipeline stages a Megatron-style trainer of a row that states none may be assumed to take
#: when nothing else fits (the fewest that do): these (an uneven last stage allowed, as
#: Megatron's ``decoder_first/last_pipeline_num_layers`` give), or any count up to
#: :data:`MAX_FIT_PP` that divides the model's layers (:func:`fit_pp`)
FIT_PP = (2, 4, 8, 16, 32)
MAX_FIT_PP = 64


def fit_pp(pool: int, layers: int) -> list[int]:
    """Pipeline sizes, fewest first, a pool of ``pool`` GPUs may be assumed to split a model
    of ``layers`` layers over: a size of :data:`FIT_PP`, or one that divides the layers (a
    1,008-GPU pool and Llama-3.1-405B's 126 layers: 7, 9, 14, ... stages), dividing the pool."""
    return [
        p
        for p in range(2, min(MAX_FIT_PP, layers) + 1)
        if pool % p == 0 and (p in FIT_PP or layers % p == 0)
    ]


#: context-parallel sizes a trainer of a row that states none may be assumed to take when
#: nothing else fits (the fewest that do): long sequences split over ranks, as verl's Ulysses
#: ``ulysses_sequence_parallel_size`` and Megatron's / NeMo-RL's ``context_parallel_size`` do
FIT_CP = (2, 4, 8)
#: how a row's assumptions name each size a fit measure took
_FIT_SAYS = {
    "train_pp": "{} pipeline stages",
    "critic_pp": "the critic's pool in {} pipeline stages",
    "train_cp": "the sequence split over {} context-parallel ranks",
}


def solve_row(case: Any, calib: Calibration = DEFAULT) -> tuple[Any, RowLayout, StepPrediction]:
    """:func:`solve_layout` for a run that happened (a published row): when no layout fits
    the devices' memory as the row is described, what such systems do to fit is assumed
    where the row does not say -- activation recompute and the solved layouts are already
    among the candidates; then, for a Megatron-style trainer whose pipeline size the row
    leaves blank (``case.pp_open``), the fewest pipeline stages of :func:`fit_pp` that fit
    (how Megatron recipes spread a model over nodes); then the trainer's optimizer on the
    host (CPU offload: ``Workload.assumed_optimizer_on_host``), alone and with those stages;
    then, for a trainer whose context-parallel size the row leaves blank (``case.cp_open``),
    the fewest ranks of :data:`FIT_CP` a sequence is split over; then, on a trainer pool of
    its own, every model's state on the host while another runs (``case.idle_offload``).
    Returns the case as priced (its workload carries the measure), the layout (``solved``
    names each measure) and the prediction. A run that happened is never refused for memory while such a measure
    remains; the first refusal is raised when none fits."""
    try:
        lay, pred = solve_layout(case, calib)
        return case, lay, pred
    except (InfeasiblePlan, ValueError) as exc:
        first = exc
    # a row stating its optimizer on the host (``cpu_adam``) keeps it there in every trial
    stated_host = case.workload.assumed_optimizer_on_host
    fitted = replace(case, workload=replace(case.workload, assumed_optimizer_on_host=True))
    pool = fitted.layout.train_gpus or case.num_gpus

    critic = getattr(case, "critic_gpus", 0)

    def staged(c: Any) -> list[Any]:
        """The trainer in the fewest stages that fit; a critic on its own pool (its server's
        own layout) also in more stages than the actor, fewest first."""
        if not getattr(case, "pp_open", False) or case.engine == "fsdp":
            return []
        out = []
        for pp in [c.layout.train_pp] + fit_pp(pool, case.model.layers):
            if pp != c.layout.train_pp:
                out.append(replace(c, layout=replace(c.layout, train_pp=pp)))
            out += [
                replace(c, layout=replace(c.layout, train_pp=pp, critic_pp=cpp))
                for cpp in (fit_pp(critic, case.model.layers) if critic else [])
                if cpp > pp
            ]
        return out

    tries = staged(case) if stated_host else staged(case) + [fitted] + staged(fitted)
    if getattr(case, "cp_open", False):
        # the sequence split over ranks: its activations (and logits) per rank / cp
        tries += [
            replace(fitted, layout=replace(fitted.layout, train_cp=cp))
            for cp in FIT_CP
            if pool % (cp * fitted.layout.train_pp) == 0
        ]
    if not case.colocated:
        # a trainer pool holding several models (reference, reward model, critic): each one's
        # state on the host while another runs (colocated rows offload already)
        offloaded = replace(fitted, idle_offload=True)
        tries += [offloaded, *staged(offloaded)]
    for trial in tries:
        try:
            lay, pred = solve_layout(trial, calib)
        except (InfeasiblePlan, ValueError):
            continue
        host = trial.workload.assumed_optimizer_on_host and not stated_host
        # the sizes this trial assumed beyond the row, and how each is said
        taken = {
            k: getattr(lay, k) for k in _FIT_SAYS if getattr(lay, k) != getattr(case.layout, k)
        }
        says = [_FIT_SAYS[k].format(v) for k, v in taken.items()]
        idle = getattr(trial, "idle_offload", False)
        if idle:
            says.insert(
                0,
                "the trainer pool's models each on the host while another runs (OpenRLHF's "
                "--ref_reward_offload, DeepSpeed-Chat's offload), priced as moves over the host link",
            )
        if host:
            says.insert(
                0,
                "the trainer's optimizer assumed on the host (CPU offload), priced over the host "
                "link and a CPU Adam",
            )
        pred.assumptions.append(
            "no layout fits the devices' memory as described: " + "; ".join(says)
        )
        measures = {"optimizer": "host"} if host else {}
        if idle:
            measures["idle_models"] = "host"
        return trial, replace(lay, solved={**lay.solved, **measures, **taken}), pred
    if critic and "critic_gpus" in case.unknown:
        # the system's critic pool was assumed, not stated: nothing fits beside it, so the
        # critic shares the trainer's pool (every GPU), as a row without the prior reads
        n = case.num_gpus
        one = replace(case, critic_gpus=0, layout=replace(case.layout, gen_gpus=n, train_gpus=n))
        one = replace(one, unknown=tuple(u for u in case.unknown if u != "critic_gpus"))
        return solve_row(one, calib)
    raise first
