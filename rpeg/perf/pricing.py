"""The analytical performance model: Graph + Plan + Workload + Cluster -> step prediction.

Pure and fast (tens of microseconds per plan). Every equation is in docs/perf-model.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rpeg.perf import eager_cpu
from rpeg.perf.as_run import plan_as_run
from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.perf.calibration import resolve as resolve_calibration
from rpeg.perf.generation import generation_cost, weight_sync_cost
from rpeg.perf.passes import pass_cost
from rpeg.perf.prediction import GB, StageCost, StepPrediction, Workload
from rpeg.perf.roofline import pass_factor
from rpeg.perf.schedule import record, streamed
from rpeg.perf.time_sharing import busy_floor, time_shared, unit_context
from rpeg.perf.timeline import TimelineRecord
from rpeg.perf.turn_pricing import ENV_KIND, env_cost, multiturn_generation_cost
from rpeg.perf.units import (
    FWD_KINDS,
    GEN_KIND,
    TRAIN_KINDS,
    UnitContext,
    field_bytes,
    graph_info,
    unit_plan,
)
from rpeg.plan.schema import InfeasiblePlan, Plan, UnitPlan, format_devices
from rpeg.specs import ClusterSpec, ModelSpec


# --- one execution unit -------------------------------------------------------------------
def _gen_train_plans(
    plan: Plan, units: list[tuple[str, tuple[tuple[str, str, str], ...]]]
) -> tuple[UnitPlan | None, UnitPlan | None]:
    gen_plan = train_plan = None
    for uname, members in units:
        kinds = {k for _, k, _ in members}
        if GEN_KIND in kinds and gen_plan is None:
            gen_plan = unit_plan(plan, uname)
        if "train_actor" in kinds and train_plan is None:
            train_plan = unit_plan(plan, uname)
    return gen_plan, train_plan


def _price_unit(
    c: UnitContext,
    info: dict[str, Any],
    uname: str,
    members: tuple[tuple[str, str, str], ...],
    gen_plan: UnitPlan | None,
    train_plan: UnitPlan | None,
) -> StageCost:
    """Cost of one execution unit: its stages, the streaming overlap inside a fused group,
    the dispatch of its task and the hand-off of its inputs from other process groups."""
    plan = c.plan
    u = unit_plan(plan, uname)
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
        if kind == GEN_KIND and c.wl.turns is not None:  # multi-turn: turn by turn
            parts.append(multiturn_generation_cost(c, u, sname, throughput_mode))
        elif kind == GEN_KIND:
            parts.append(generation_cost(c, u, sname, throughput_mode))
        elif kind == ENV_KIND:  # the environment's calls between the turns
            parts.append(env_cost(c, u, sname))
        elif kind in TRAIN_KINDS:
            sc = pass_cost(c, u, sname, kind, train=True)
            if shared_ac and kind == "train_actor":
                _value_head(c, u, sc, train=True)
            parts.append(sc)
        elif kind in FWD_KINDS:
            if kind == "old_logprob" and reuse_logprobs:
                sc = StageCost(sname, (kind,), format_devices(u.devices), u.num_devices)
            else:
                sc = pass_cost(c, u, sname, kind, train=False)
            if shared_ac and kind == "old_logprob":
                _value_head(c, u, sc, train=False)
            parts.append(sc)
        elif kind == "reward" and role == "reward_model":
            parts.append(pass_cost(c, u, sname, kind, train=False))
        elif kind == "sync_weights":
            parts.append(weight_sync_cost(c, sname, u, gen_plan, train_plan))
        elif kind == "reward":  # rule reward: host work per sample (scoring, detokenising)
            sc = StageCost(sname, (kind,), format_devices(u.devices), u.num_devices)
            sc.time_s = c.N * c.host_per_sample_s
            parts.append(sc)
        else:  # advantage: negligible on the accelerator
            parts.append(StageCost(sname, (kind,), format_devices(u.devices), u.num_devices))
    overlap = 0.0
    if uname in info["streaming"] and len(parts) > 1 and parts[0].kinds == (GEN_KIND,):
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


def _value_head(c: UnitContext, u: UnitPlan, sc: StageCost, train: bool) -> None:
    """The value head of a shared actor-critic trunk (h -> 1 per token): forward in the
    shared forward, forward+backward in the shared update, its weights + Adam state."""
    m, cal = c.model, c.calib
    passes = 3.0 if train else 1.0
    flops = passes * 2.0 * m.hidden * c.tokens
    n = u.num_devices
    tok_dev = min(c.tokens / n, c.max_seq * u.micro_batch_size)
    eff = c.gpu.matmul_eff(2.0 * tok_dev * m.hidden)
    factor = pass_factor(cal.train_eff_factor if train else cal.forward_eff_factor, c.gpu)
    t = flops / (c.peak_flops * n * eff * factor)
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
    calib = resolve_calibration(calib, cluster.name)
    info = graph_info(graph)
    plan = plan_as_run(plan, cluster, info["units"])
    c = UnitContext(plan, wl, time_shared(cluster, plan, info["units"]), model, calib)
    members = dict(info["units"]).get(unit)
    if members is None:
        known = ", ".join(n for n, _ in info["units"])
        raise KeyError(f"no execution unit {unit!r} in the graph (units: {known})")
    c = unit_context(c, cluster.num_devices, unit_plan(plan, unit).num_devices)
    gen_plan, train_plan = _gen_train_plans(plan, info["units"])
    return _price_unit(c, info, unit, members, gen_plan, train_plan)


# --- the step ---------------------------------------------------------------------------
@dataclass
class _Setup:
    """What pricing a step needs besides the calibration: the plan as run, its context at
    the given calibration, the graph's units and the pools they share."""

    c: UnitContext
    cores: int
    plan: Plan
    info: dict[str, Any]
    units: list[tuple[str, tuple[tuple[str, str, str], ...]]]
    cluster: ClusterSpec
    pools: list[Any]
    pool_of: dict[str, int]
    multi_pool: bool
    async_overlap: bool


def _setup(
    graph: Any,
    plan: Plan,
    workload: Workload | Any,
    cluster: ClusterSpec | None,
    model: ModelSpec | None,
    calib: Calibration,
) -> _Setup:
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
    calib = resolve_calibration(calib, cluster.name)
    info = graph_info(graph)
    units = info["units"]
    plan = plan_as_run(plan, cluster, units)
    cores, cluster = cluster.num_devices, time_shared(cluster, plan, units)
    c = UnitContext(plan, wl, cluster, model, calib)
    # device checks
    for uname, _ in units:
        u = unit_plan(plan, uname)
        if u.devices[-1] >= cluster.num_devices:
            raise InfeasiblePlan(
                "devices",
                f"uses device {u.devices[-1]} but cluster {cluster.name} has {cluster.num_devices} devices",
                unit=uname,
                device=u.devices[-1],
            )
    pools = plan.colocated()
    pool_of = {n: i for i, g in enumerate(pools) for n in g}
    multi_pool = len({pool_of[n] for n, _ in units}) > 1
    return _Setup(
        c, cores, plan, info, units, cluster, pools, pool_of, multi_pool,
        async_overlap=plan.staleness >= 1 and multi_pool,
    )  # fmt: skip


def _stages(s: _Setup, c: UnitContext) -> dict[str, StageCost]:
    """Every unit of the step priced in context ``c`` (the setup's, or the same at another
    calibration)."""
    gen_plan, train_plan = _gen_train_plans(s.plan, s.units)
    stages: dict[str, StageCost] = {}
    for uname, members in s.units:
        cu = unit_context(c, s.cores, unit_plan(s.plan, uname).num_devices)  # CPU: core share
        stages[uname] = _price_unit(cu, s.info, uname, members, gen_plan, train_plan)
    return stages


def _memory(
    s: _Setup, stages: dict[str, StageCost], check_memory: bool
) -> tuple[dict[str, float], dict[int, float]]:
    """(peak GB per device group, offload seconds per pool): co-resident units per pool."""
    plan, units, cluster, calib = s.plan, s.units, s.cluster, s.c.calib
    cap = cluster.gpu.hbm_gb
    dev_mem: dict[str, float] = {}
    offload_s: dict[int, float] = {}
    for i, group in enumerate(s.pools):
        names = [n for n, _ in units if n in group]
        if not names:
            continue
        # offload moves each unit's roles to host memory between uses (the runtime's
        # rpeg.runtime.unit_memory); on CPU workers the host is the device: nothing is freed
        # and nothing moves, so nothing is priced
        all_off = (
            all(plan.units[n].offload for n in names)
            and len(names) > 1
            and not eager_cpu.is_cpu(cluster.gpu)
        )
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
    return dev_mem, offload_s


def _schedule(
    s: _Setup, stages: dict[str, StageCost], offload_s: dict[int, float]
) -> tuple[float, list[TimelineRecord]]:
    """The step's seconds and its Gantt records from the units' times."""
    c, plan, units, pool_of = s.c, s.plan, s.units, s.pool_of
    timeline: list[TimelineRecord] = []
    pool_busy: dict[int, float] = {}
    if s.async_overlap:
        # steady state with bounded staleness: every pool works continuously, the slower
        # pool sets the step time (the bound k >= 1 lets the faster one run ahead).
        for uname, _ in units:
            i = pool_of[uname]
            t0 = pool_busy.get(i, 0.0)
            d = stages[uname].time_s
            timeline.append(record(stages[uname], t0, t0 + d))
            pool_busy[i] = t0 + d
        step = max(pool_busy.values())
        # CPU workers of the pools share the machine's cores (rpeg.perf.time_sharing)
        step = _cores_shared(c, s.cores, plan, stages, step, timeline)
    elif s.multi_pool and plan.streaming:
        # k = 0 with streaming: the consumers take the batch in train_minibatches chunks as
        # generation finishes them (evenly over the generation) -- a flow shop: each chunk
        # goes through the units in order, a unit starts a chunk when the chunk is ready and
        # its pool is free (units of one pool take turns). Every unit streams but the
        # weight sync, which follows the last update.
        step = streamed(stages, units, pool_of, max(1, c.wl.train_minibatches), timeline)
        step = _cores_shared(c, s.cores, plan, stages, step, timeline)  # pools at once, too
    else:
        t = 0.0
        for uname, _ in units:
            d = stages[uname].time_s
            timeline.append(record(stages[uname], t, t + d))
            t += d
        step = t
    # fixed costs after the units, each a named record so that the Gantt ends at the step
    off = sum(offload_s.values())
    group = timeline[0].device_group if timeline else "all"
    if offload_s:
        timeline.append(TimelineRecord("offload/reload", group, step, step + off, kind="offload"))
    step += off
    if c.step_overhead_s > 0:
        timeline.append(
            TimelineRecord(
                "step overhead", group, step, step + c.step_overhead_s, kind="step_overhead"
            )
        )
    step += c.step_overhead_s
    return step, timeline


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
    s = _setup(graph, plan, workload, cluster, model, calib)
    return _prediction(s, _stages(s, s.c), check_memory)[0]


def _prediction(
    s: _Setup, stages: dict[str, StageCost], check_memory: bool
) -> tuple[StepPrediction, dict[int, float]]:
    """The step of the priced ``stages`` (and each pool's offload seconds)."""
    c = s.c
    dev_mem, offload_s = _memory(s, stages, check_memory)
    step, timeline = _schedule(s, stages, offload_s)
    ndev = s.plan.num_devices
    useful = sum(st.flops for st in stages.values())
    mfu = useful / (step * ndev * s.cluster.gpu.peak_flops(c.prec)) if step > 0 else 0.0
    pred = StepPrediction(
        step_s=step,
        stages=stages,
        num_devices=ndev,
        tokens_per_step=c.tokens,
        tokens_per_s_per_gpu=c.tokens / step / ndev if step > 0 else 0.0,
        mfu=mfu,
        timeline=timeline,
        device_memory_gb=dev_mem,
        capacity_gb=s.cluster.gpu.hbm_gb,
        assumptions=c.assumptions,
    )
    return pred, offload_s


def _check_points(
    gen_scales: tuple[float, ...], train_scales: tuple[float, ...]
) -> list[tuple[float, float]]:
    """Where :func:`predict_grid` checks the affine form: (2, 2) and the grid's corners."""
    pts = [(2.0, 2.0), (min(gen_scales), min(train_scales)), (max(gen_scales), max(train_scales))]
    return list(dict.fromkeys(pts))


def _timed(stages: dict[str, StageCost], times: dict[str, float]) -> dict[str, StageCost]:
    """Shallow copies of ``stages`` taking ``times`` (what the schedule reads of them)."""
    out = {}
    for n, st in stages.items():
        out[n] = copy.copy(st)
        out[n].time_s = times[n]
    return out


#: relative agreement a unit's time must show with ``a + b / g + c / t`` at the check points
#: for :func:`predict_grid` to rebuild it from three pricings (else it prices every point)
_AFFINE_RTOL = 1e-9


def predict_grid(
    graph: Any,
    plan: Plan,
    workload: Workload | Any,
    gen_scales: tuple[float, ...],
    train_scales: tuple[float, ...],
    *,
    calib: Calibration,
    cluster: ClusterSpec | None = None,
    model: ModelSpec | None = None,
) -> tuple[StepPrediction, list[list[float]]]:
    """``predict(..., check_memory=False)`` at ``calib`` (the prediction) and the step
    seconds at ``calib`` with ``gen_eff_scale = g`` and ``train_eff_scale = fwd_eff_scale
    = t`` for every ``g`` in ``gen_scales`` (rows) and ``t`` in ``train_scales`` (columns).

    A unit's time is ``a + b / g + c / t``: each of its parts is either not scaled (host
    work, weight sync, hand-offs) or divided by one of the scales (generation by ``g``,
    forward and training passes by ``t``: :func:`rpeg.perf.eager_cpu.scaled`). So the units
    are priced at (1, 1), (2, 1) and (1, 2), checked at (2, 2) and at the grid's corners,
    and the schedule is rebuilt at every point from the units' times (the step's max and
    flow shop are not affine). A fused streaming unit (its consumers' overlap is a ``min``)
    or a unit that fails the check has every point priced."""
    from dataclasses import replace as _replace

    s = _setup(graph, plan, workload, cluster, model, calib)

    def at(g: float, t: float) -> dict[str, StageCost]:
        cal = _replace(s.c.calib, gen_eff_scale=g, train_eff_scale=t, fwd_eff_scale=t)
        return _stages(s, UnitContext(s.plan, s.c.wl, s.cluster, s.c.model, cal))

    base = _stages(s, s.c)
    pred, offload_s = _prediction(s, base, False)
    p11, p21, p12 = at(1.0, 1.0), at(2.0, 1.0), at(1.0, 2.0)
    checks = [(g, t, at(g, t)) for g, t in _check_points(gen_scales, train_scales)]
    affine: dict[str, tuple[float, float, float]] = {}
    for n in p11:
        if n in s.info["streaming"]:
            continue  # its consumers' overlap is a min of scaled and unscaled times
        b = 2.0 * (p11[n].time_s - p21[n].time_s)
        cc = 2.0 * (p11[n].time_s - p12[n].time_s)
        a = p11[n].time_s - b - cc
        if all(
            abs(a + b / g + cc / t - p[n].time_s) <= _AFFINE_RTOL * max(1.0, p[n].time_s)
            for g, t, p in checks
        ):
            affine[n] = (a, b, cc)
    grid: list[list[float]] = []
    for g in gen_scales:
        row = []
        for t in train_scales:
            priced = {} if len(affine) == len(base) else at(g, t)
            times = {
                n: (affine[n][0] + affine[n][1] / g + affine[n][2] / t)
                if n in affine
                else priced[n].time_s
                for n in base
            }
            row.append(_schedule(s, _timed(base, times), offload_s)[0])
        grid.append(row)
    return pred, grid


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
    if set(sc.kinds) == {"reward"} and sc.memory_gb.get("weights", 0.0) > 0:
        return "reward_model"  # a learned reward model's forward: weights of its own
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


def _cores_shared(
    c: Any,
    cores: int,
    plan: Plan,
    stages: dict[str, StageCost],
    step: float,
    timeline: list[TimelineRecord],
) -> float:
    """Pools that run at the same time (k >= 1, or streaming at k = 0): on CPU workers the
    step is at least the units' work over the cores (:func:`busy_floor`), a ``cores shared``
    Gantt record from the pools' end to it."""
    times = {n: st.time_s for n, st in stages.items()}
    floor = busy_floor(c, cores, times, {n: plan.units[n].num_devices for n in times})
    if floor <= step:
        return step
    timeline.append(TimelineRecord("cores shared", "all", step, floor, kind="cpu_share"))
    return floor
