"""Plan -> a typed description of one RL step on actor groups (:class:`CompiledStep`).

The description is what the Prefect flow executes and what the golden tests compare:

* ``actor_groups``: one group per distinct device set of the plan. A group has one Dask
  actor per device (rank); its ranks form one torch.distributed process group (gloo on CPU,
  NCCL on GPU) for data parallelism. A group hosts every model role its units use (so
  colocated units share processes and weights), with an optimizer for trainable roles; its
  layout is :mod:`rpeg.compile.layouts`'.
* ``tasks``: one Prefect task per execution unit (a stage or a fused group), in
  topological order, with ``depends_on`` (data edges), ``after`` (colocated units with no
  data dependency run in this order on their shared devices) and ``concurrent_with``
  (units on disjoint devices with no dependency path: they overlap), and the unit's
  micro-batch size and token budget.
* ``phase``: ``rollout`` units run before the staleness buffer, ``train`` units after it.
  With ``staleness`` k > 0 the rollout of step t+1..t+k overlaps training of step t.
* ``weight_sync``: ``shared`` when the generators are the trainer's own processes (no copy),
  else ``bucketed`` from the trainer group to the generator group(s): a broadcast of the full
  weights in ``bucket_bytes`` buckets over a process group spanning the trainer's rank 0 and
  every generator rank, every ``every_steps`` updates.
* ``buffer``: the units on each side of the staleness buffer and the samples of a step; the
  bound k is the step's ``staleness``.

``pp``/``cp``/``ep`` > 1 are refused (and removed from the search space,
:mod:`rpeg.search.space`). Every field the runtime reads is checked by
:func:`rpeg.compile.checks.check_step`: a value the runtime cannot honour is a ConfigError
naming the field.

Pure: imports no torch, dask or prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rpeg.compile.checks import (
    batch_problems,
    check_step,
    eager_problems,
    env_problems,
    packing_problems,
    plan_problems,
    raise_if,
)
from rpeg.compile.layouts import GroupDraft, gen_dp, group_layouts
from rpeg.compile.sources import available_devices, resolve
from rpeg.compile.step import (
    DEFAULT_BUCKET_BYTES,
    FORWARD_KINDS,
    ROLLOUT_KINDS,
    TRAINABLE_KINDS,
    Buffer,
    CompiledStep,
    GroupSpec,
    Phase,
    TaskSpec,
    WeightSync,
)
from rpeg.errors import Problem
from rpeg.ir import StageKind
from rpeg.perf.prediction import Workload

__all__ = ["compile_step"]


@dataclass(frozen=True)
class Unit:
    """An execution unit of the graph as the compiler sees it."""

    name: str
    stages: tuple[Any, ...]  # the graph's Stage objects, in order
    fused: bool
    streaming: bool

    @property
    def kinds(self) -> tuple[StageKind, ...]:
        return tuple(StageKind(s.kind) for s in self.stages)


def compile_step(
    plan_or_graph: Any,
    config: Any,
    *,
    cluster_devices: int | None = None,
    model: Any = None,
) -> CompiledStep:
    """Compile to the typed :class:`CompiledStep`; raise ConfigError listing every problem
    (unknown unit or role, too many devices, unsupported layout) before anything starts.
    ``model``: the policy's ModelSpec when the caller read it from a model folder
    (:func:`rpeg.specs.hf.priced_model`); else the catalog's ``model.name``. Reads no model
    file."""
    graph, plan = resolve(plan_or_graph, config)
    from rpeg.ir import validate

    validate(graph)
    units = _units(graph)
    names = [u.name for u in units]
    have = cluster_devices if cluster_devices is not None else available_devices(config)
    roles = [(s.name, _val(s.role)) for u in units for s in u.stages if s.role is not None]
    raise_if(plan_problems(plan, names, roles, have) + env_problems(graph, config))
    kinds_of = {u.name: u.kinds for u in units}
    deps = _dependencies(graph, units)
    phase = _phases(names, kinds_of, deps)
    raise_if(_fused_ahead(names, kinds_of, phase, graph.staleness))
    drafts, group_of = _group_drafts(units, plan, bool(graph.shared_actor_critic))
    lay = group_layouts(drafts, kinds_of, plan, config, model)
    from rpeg.compile.layouts import policy_model
    from rpeg.compile.stage_checks import stage_notes, stage_problems

    spec = policy_model(config, model)
    pp_notes, pp_problems = stage_notes(lay.groups, kinds_of, plan)
    raise_if(
        list(lay.problems)
        + pp_problems
        + stage_problems(lay.groups, kinds_of, plan, config, spec)
        + packing_problems(plan, spec)
        + eager_problems(plan, kinds_of)
    )
    groups = lay.groups
    raise_if(batch_problems(groups, config.workload))
    tasks = _tasks(units, plan, config, graph, deps, phase, group_of, groups, spec)
    step = CompiledStep(
        pipeline=graph.algorithm,
        graph=graph.name,
        staleness=int(graph.staleness),
        num_devices=len({d for g in groups for d in g.devices}),
        actor_groups=groups,
        tasks=tasks,
        weight_sync=_weight_sync(tasks),
        buffer=Buffer(samples_per_step=int(config.workload.samples_per_step)),
        notes=lay.notes + tuple(pp_notes),
    )
    check_step(step)
    return step


# --------------------------------------------------------------------------- named steps


def _val(x: Any) -> str:
    return getattr(x, "value", str(x))


def _units(graph: Any) -> list[Unit]:
    """The graph's execution units in topological order (a stage, or a fused group)."""
    out = []
    for u in graph.execution_units():
        stages = getattr(u, "stages", None)
        if stages is None:
            out.append(Unit(u.name, (u,), False, False))
        else:
            out.append(Unit(u.name, tuple(graph.stage(s) for s in stages), True, bool(u.streaming)))
    return out


def _dependencies(graph: Any, units: list[Unit]) -> dict[str, list[str]]:
    """unit -> the units it takes data from (graph edges between units)."""
    unit_of_stage = {s.name: u.name for u in units for s in u.stages}
    deps: dict[str, list[str]] = {u.name: [] for u in units}
    for e in graph.edges:
        a, b = unit_of_stage[e.src], unit_of_stage[e.dst]
        if a != b and a not in deps[b]:
            deps[b].append(a)
    return deps


def _phases(
    names: list[str], kinds_of: dict[str, tuple[StageKind, ...]], deps: dict[str, list[str]]
) -> dict[str, Phase]:
    """``rollout``: a unit that generates, or only rewards/generates after rollout units;
    everything else ``train``."""
    phase: dict[str, Phase] = {}
    for n in names:
        ks = set(kinds_of[n])
        rollout = StageKind.generate in ks or (
            ks <= ROLLOUT_KINDS and all(phase.get(d) == "rollout" for d in deps[n])
        )
        phase[n] = "rollout" if rollout else "train"
    return phase


def _fused_ahead(
    names: list[str], kinds_of: dict[str, tuple[StageKind, ...]], phase: dict[str, Phase], k: int
) -> list[Problem]:
    """A rollout unit fused with training cannot run ahead of training (k > 0)."""
    if k == 0:
        return []
    return [
        Problem(f"unit {n}", f"fuses generation with training: cannot run ahead with k={k}")
        for n in names
        if phase[n] == "rollout" and set(kinds_of[n]) & set(TRAINABLE_KINDS)
    ]


def _group_drafts(
    units: list[Unit], plan: Any, shared_actor_critic: bool
) -> tuple[list[GroupDraft], dict[str, str]]:
    """One group per distinct device set, in order of first use; unit -> its group."""
    drafts: dict[tuple[int, ...], GroupDraft] = {}
    group_of: dict[str, str] = {}
    for u in units:
        devs = tuple(plan.units[u.name].devices)
        g = drafts.setdefault(devs, GroupDraft(f"g{len(drafts)}", devs))
        g.units.append(u.name)
        for s in u.stages:
            r = None if s.role is None else _val(s.role)
            if r and r not in g.roles:
                g.roles.append(r)
            tr = TRAINABLE_KINDS.get(StageKind(s.kind))
            if tr:
                tr = "actor" if shared_actor_critic else tr
                if tr not in g.trainable:
                    g.trainable.append(tr)
        group_of[u.name] = g.name
    return list(drafts.values()), group_of


def _tasks(
    units: list[Unit],
    plan: Any,
    config: Any,
    graph: Any,
    deps: dict[str, list[str]],
    phase: dict[str, Phase],
    group_of: dict[str, str],
    groups: tuple[GroupSpec, ...],
    spec: Any = None,
) -> tuple[TaskSpec, ...]:
    """The units with their order within a step (``after``, ``concurrent_with``), their
    micro-batching (packed or not, for the policy model ``spec``) and streaming chunk."""
    names = [u.name for u in units]
    ancestors: dict[str, set[str]] = {}
    for n in names:  # names are in topological order
        a: set[str] = set()
        for d in deps[n]:
            a |= {d} | ancestors[d]
        ancestors[n] = a
    devset = {n: set(plan.units[n].devices) for n in names}
    by_name = {g.name: g for g in groups}
    budget = config.workload.max_tokens_per_micro_batch or None
    out = []
    for i, u in enumerate(units):
        n = u.name
        after, conc = [], []
        for j, m in enumerate(names):
            if m == n or m in ancestors[n] or n in ancestors[m]:
                continue
            if devset[n] & devset[m]:
                if j < i:
                    after.append(m)
            elif phase[m] == phase[n]:
                conc.append(m)
        ks = set(u.kinds)
        forward = bool(ks & FORWARD_KINDS)
        out.append(
            TaskSpec(
                name=n,
                stages=tuple(s.name for s in u.stages),
                kinds=u.kinds,
                group=group_of[n],
                phase=phase[n],
                micro_batch_size=_micro_batch(plan.units[n].micro_batch_size, ks),
                fused=u.fused,
                streaming=u.streaming,
                shared_forward=bool(graph.shared_actor_critic) and StageKind.old_logprob in ks,
                depends_on=tuple(deps[n]),
                after=tuple(after),
                concurrent_with=tuple(conc),
                max_tokens_per_micro_batch=_budget(budget, plan.units[n], config, spec)
                if forward
                else None,
                seq_packing=forward and plan.units[n].packs(spec),
                stream_chunk_prompts=_chunk(config, by_name[group_of[n]]) if u.streaming else 0,
                offload=bool(plan.units[n].offload),
            )
        )
    return tuple(out)


def _weight_sync(tasks: tuple[TaskSpec, ...]) -> WeightSync:
    """Shared when the generators are the trainer's ranks, else bucketed to their groups."""
    gen_groups = sorted({t.group for t in tasks if t.generates})
    train_group = next(t.group for t in tasks if StageKind.train_actor in t.kinds)
    targets = tuple(g for g in gen_groups if g != train_group)
    return WeightSync(
        mode="bucketed" if targets else "shared",
        source=train_group,
        targets=targets,
        every_steps=1,
        bucket_bytes=DEFAULT_BUCKET_BYTES,
    )


def _budget(budget: int | None, u: Any, config: Any, spec: Any) -> int | None:
    """A forward unit's token budget per micro-batch: the workload's
    ``max_tokens_per_micro_batch`` where set; else, for a packed unit, ``micro_batch_size``
    sequences of the longest length the model prices (``Workload.max_seq``: prompt cap +
    response cap), as the performance model cuts it (rpeg.perf.passes); else none (by
    count)."""
    if budget or not u.packs(spec):
        return budget
    return int(u.micro_batch_size) * Workload.from_config(config.workload).max_seq


def _micro_batch(size: int, kinds: set[StageKind]) -> int:
    """The plan's micro-batch size for a unit with a forward pass; 1 for the units that run
    none (reward, advantage, weight sync: one pass over the rank's rows, whatever the plan
    builders put there). Generation keeps the plan's value: check_step refuses it unless 1."""
    if kinds & FORWARD_KINDS or StageKind.generate in kinds:
        return size
    return 1


def _chunk(config: Any, g: GroupSpec) -> int:
    """Prompt groups per streamed chunk: a quarter of a rank's prompts (at least one)."""
    per_rank = max(1, int(config.workload.num_prompts) // gen_dp(g))
    return max(1, per_rank // 4)
