"""Plan -> a plain-data description of one RL step on actor groups (:class:`CompiledStep`).

The description is what the Prefect flow executes and what the golden tests compare:

* ``actor_groups``: one group per distinct device set of the plan. A group has one Dask
  actor per device (rank); its ranks form one torch.distributed process group (gloo on CPU,
  NCCL on GPU) for data parallelism. A group hosts every model role its units use (so
  colocated units share processes and weights), with an optimizer for trainable roles.
* ``tasks``: one Prefect task per execution unit (a stage or a fused group), in
  topological order, with ``depends_on`` (data edges), ``after`` (colocated units with no
  data dependency run in this order on their shared devices) and ``concurrent_with``
  (units on disjoint devices with no dependency path: they overlap).
* ``phase``: ``rollout`` units run before the staleness buffer, ``train`` units after it.
  With ``staleness`` k > 0 the rollout of step t+1..t+k overlaps training of step t.
* ``weight_sync``: ``shared`` when the generators are the trainer's own processes (no copy),
  else ``bucketed`` from the trainer group to the generator group(s).

Pure: imports no torch, dask or prefect.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from rpeg.errors import ConfigError, Problem

SUPPORTED_ROLES = ("actor", "reference", "critic")
ROLLOUT_KINDS = frozenset({"generate", "reward"})
TRAINABLE_KINDS = {"train_actor": "actor", "train_critic": "critic"}
FORMAT_VERSION = 1


@dataclass
class ActorGroupSpec:
    name: str
    devices: list[int]
    world_size: int
    roles: list[str]
    trainable: list[str]
    units: list[str]
    backend: str = "gloo"
    # How the group's ranks lay out its roles (world_size = dp * tp). Training roles shard
    # over dp with FSDP2 when ``fsdp``; tp > 1 splits every block by DTensor tensor
    # parallelism (column-wise q/k/v/gate/up, row-wise o/down). ``gen_tp``: tensor-parallel
    # size of the generation engine on these ranks (its own copy when it differs from tp).
    dp: int = 0  # 0: world_size // tp
    tp: int = 1
    fsdp: bool = False
    gen_tp: int = 1
    device_type: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"  # the plan's precision on the device (bf16 on GPU)

    def __post_init__(self) -> None:
        if not self.dp:
            self.dp = max(1, self.world_size // max(1, self.tp))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TaskSpec:
    name: str
    stages: list[str]
    kinds: list[str]
    group: str
    phase: str
    fused: bool = False
    streaming: bool = False
    shared_forward: bool = False  # actor-critic sharing: logits and values from one forward
    depends_on: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    concurrent_with: list[str] = field(default_factory=list)
    micro_batch_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompiledStep:
    pipeline: str
    graph: str
    staleness: int
    shared_actor_critic: bool
    num_devices: int
    actor_groups: list[ActorGroupSpec]
    tasks: list[TaskSpec]
    weight_sync: dict[str, Any]
    buffer: dict[str, Any]
    format: int = FORMAT_VERSION

    # ---------------------------------------------------------------- access
    def task(self, name: str) -> TaskSpec:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def group(self, name: str) -> ActorGroupSpec:
        for g in self.actor_groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def tasks_in(self, phase: str) -> list[TaskSpec]:
        return [t for t in self.tasks if t.phase == phase]

    @property
    def rollout_group(self) -> str:
        return next(t.group for t in self.tasks if "generate" in t.kinds)

    @property
    def trainer_group(self) -> str:
        return next(t.group for t in self.tasks if "train_actor" in t.kinds)

    # ---------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "pipeline": self.pipeline,
            "graph": self.graph,
            "staleness": self.staleness,
            "shared_actor_critic": self.shared_actor_critic,
            "num_devices": self.num_devices,
            "actor_groups": [g.to_dict() for g in self.actor_groups],
            "tasks": [t.to_dict() for t in self.tasks],
            "weight_sync": dict(self.weight_sync),
            "buffer": dict(self.buffer),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompiledStep:
        return cls(
            pipeline=d["pipeline"],
            graph=d["graph"],
            staleness=d["staleness"],
            shared_actor_critic=d["shared_actor_critic"],
            num_devices=d["num_devices"],
            actor_groups=[ActorGroupSpec(**g) for g in d["actor_groups"]],
            tasks=[TaskSpec(**t) for t in d["tasks"]],
            weight_sync=d["weight_sync"],
            buffer=d["buffer"],
            format=d.get("format", FORMAT_VERSION),
        )


# --------------------------------------------------------------------------- resolution


def graph_from_config(config: Any) -> Any:
    """The IR graph of ``config``'s algorithm: the run's staleness bound, and the algorithm
    parameters of the config (not the builders' presets), so the graph records what runs."""
    from rpeg.ir import build, share_actor_critic

    a = config.algorithm
    opts: dict[str, Any] = {
        "staleness": config.runtime.max_staleness,
        "use_reference": a.use_reference,
        "kl_coef": a.kl_coef,
        "clip_low": a.clip_low,
        "clip_high": a.clip_high,
        "dual_clip": a.dual_clip,
        "dynamic_sampling": a.dynamic_sampling,
        "overlong_buffer": a.overlong_penalty_tokens or None,
        "loss_aggregation": a.loss_aggregation,
        "entropy_coef": a.entropy_coef,
    }
    if a.name == "ppo":
        opts.update(gamma=a.gamma, gae_lambda=a.gae_lambda)
        if a.value_clip is not None:
            opts["value_clip"] = a.value_clip
    elif a.name in ("grpo", "rloo"):
        opts["group_size"] = config.workload.samples_per_prompt
    g = build(a.name, **opts)
    if a.name == "ppo" and a.share_actor_critic:
        g = share_actor_critic(g)
    return g


def graph_from_plan(plan: Any, config: Any) -> Any:
    from rpeg.ir import bound_async, build, from_dict

    if plan.graph.inline:
        g = from_dict(plan.graph.inline)
    elif plan.graph.builder:
        g = build(plan.graph.builder, **plan.graph.options)
    else:
        g = graph_from_config(config)
    if g.staleness != plan.staleness:
        g = bound_async(g, plan.staleness)
    return g


def available_devices(config: Any) -> int:
    c = config.cluster
    return c.num_devices or c.n_workers


def default_plan(graph: Any, config: Any) -> Any:
    """Sync (k=0) or one device: everything colocated on all devices (data parallel).
    k>0 with >=2 devices: rollout on the first half, training on the rest."""
    from rpeg.plan import colocated_plan, disaggregated_plan

    n = available_devices(config)
    mbs = config.workload.micro_batch_size
    if graph.staleness == 0 or n == 1:
        return colocated_plan(graph, num_devices=n, micro_batch_size=mbs)
    gen = max(1, n // 2)
    return disaggregated_plan(graph, gen_devices=gen, train_devices=n - gen, micro_batch_size=mbs)


def resolve(plan_or_graph: Any, config: Any) -> tuple[Any, Any]:
    """(graph, plan) from a Plan, a Graph, a plan dict/YAML path, or None (from config)."""
    from rpeg.ir import Graph
    from rpeg.plan import Plan

    obj = plan_or_graph
    if obj is None and config.plan is not None:
        obj = config.plan
    if isinstance(obj, str):
        obj = Plan.from_yaml(obj)
    elif isinstance(obj, dict):
        obj = Plan.from_dict(obj)
    if obj is None:
        graph = graph_from_config(config)
        return graph, default_plan(graph, config)
    if isinstance(obj, Graph):
        return obj, default_plan(obj, config)
    if isinstance(obj, Plan):
        return graph_from_plan(obj, config), obj
    raise ConfigError(
        [
            Problem(
                "plan", f"expected a Plan, Graph, plan dict or YAML path, got {type(obj).__name__}"
            )
        ]
    )


# --------------------------------------------------------------------------- compile


def _unit_info(graph: Any, unit: Any) -> tuple[str, list[Any], bool, bool]:
    stages = getattr(unit, "stages", None)
    if stages is None:
        return unit.name, [unit], False, False
    return unit.name, [graph.stage(s) for s in stages], True, bool(unit.streaming)


def _val(x: Any) -> str:
    return getattr(x, "value", str(x))


def compile_step(
    plan_or_graph: Any, config: Any, *, cluster_devices: int | None = None
) -> CompiledStep:
    """Compile to the plain-data :class:`CompiledStep`; raise ConfigError listing every
    problem (unknown unit or role, too many devices, unsupported layout) before anything
    starts."""
    graph, plan = resolve(plan_or_graph, config)
    graph.validate()
    problems: list[Problem] = []
    units = graph.execution_units()
    info = [_unit_info(graph, u) for u in units]
    names = [i[0] for i in info]
    for n in plan.units:
        if n not in names:
            problems.append(
                Problem(
                    f"plan.units.{n}", f"unknown execution unit; the graph has: {', '.join(names)}"
                )
            )
    for n in names:
        if n not in plan.units:
            problems.append(
                Problem(f"plan.units.{n}", "missing: every execution unit needs devices")
            )
    for _n, stages, _f, _s in info:
        for s in stages:
            if s.role is not None and _val(s.role) not in SUPPORTED_ROLES:
                problems.append(
                    Problem(
                        f"stage {s.name}",
                        f"unknown role {_val(s.role)!r} for the runtime; allowed: {', '.join(SUPPORTED_ROLES)}",
                    )
                )
    have = cluster_devices if cluster_devices is not None else available_devices(config)
    need = plan.num_devices
    max_dev = max((d for u in plan.units.values() for d in u.devices), default=-1)
    if need > have or max_dev >= have:
        problems.append(
            Problem(
                "plan",
                f"asks for {max(need, max_dev + 1)} devices (indices up to {max_dev}) but the cluster has {have}",
            )
        )
    for n, u in plan.units.items():
        if u.tp * u.pp * u.cp != 1:
            problems.append(
                Problem(f"plan.units.{n}", "the runtime does data parallelism only (tp=pp=cp=1)")
            )
    if problems:
        raise ConfigError(problems, title="plan refused before any actor starts")

    # ---- phases
    kinds_of = {n: [_val(s.kind) for s in stages] for n, stages, _f, _s in info}
    unit_of_stage = {s.name: n for n, stages, _f, _s in info for s in stages}
    deps: dict[str, list[str]] = {n: [] for n in names}
    for e in graph.edges:
        a, b = unit_of_stage[e.src], unit_of_stage[e.dst]
        if a != b and a not in deps[b]:
            deps[b].append(a)
    phase: dict[str, str] = {}
    for n in names:
        ks = set(kinds_of[n])
        if "generate" in ks or (
            ks <= ROLLOUT_KINDS and all(phase.get(d) == "rollout" for d in deps[n])
        ):
            phase[n] = "rollout"
        else:
            phase[n] = "train"
    k = graph.staleness
    for n in names:
        if phase[n] == "rollout" and set(kinds_of[n]) & set(TRAINABLE_KINDS) and k > 0:
            problems.append(
                Problem(f"unit {n}", f"fuses generation with training: cannot run ahead with k={k}")
            )
    if problems:
        raise ConfigError(problems, title="plan refused before any actor starts")

    # ---- actor groups: one per distinct device set, in order of first use
    groups: dict[tuple[int, ...], ActorGroupSpec] = {}
    group_of: dict[str, str] = {}
    for n, stages, _f, _s in info:
        devs = tuple(plan.units[n].devices)
        if devs not in groups:
            groups[devs] = ActorGroupSpec(
                name=f"g{len(groups)}",
                devices=list(devs),
                world_size=len(devs),
                roles=[],
                trainable=[],
                units=[],
            )
        g = groups[devs]
        g.units.append(n)
        for s in stages:
            r = None if s.role is None else _val(s.role)
            if r and r not in g.roles:
                g.roles.append(r)
            tr = TRAINABLE_KINDS.get(_val(s.kind))
            if tr:
                tr = "actor" if graph.shared_actor_critic else tr
                if tr not in g.trainable:
                    g.trainable.append(tr)
        group_of[n] = g.name
    for g in groups.values():
        g.roles = sorted(g.roles, key=SUPPORTED_ROLES.index)
        g.trainable = sorted(g.trainable, key=SUPPORTED_ROLES.index)

    # ---- ordering and concurrency within a step
    ancestors: dict[str, set[str]] = {}
    for n in names:  # names are in topological order
        a: set[str] = set()
        for d in deps[n]:
            a |= {d} | ancestors[d]
        ancestors[n] = a
    devset = {n: set(plan.units[n].devices) for n in names}
    tasks: list[TaskSpec] = []
    for i, (n, stages, fused, streaming) in enumerate(info):
        after, conc = [], []
        for j, m in enumerate(names):
            if m == n or m in ancestors[n] or n in ancestors[m]:
                continue
            if devset[n] & devset[m]:
                if j < i:
                    after.append(m)
            elif phase[m] == phase[n]:
                conc.append(m)
        ks = set(kinds_of[n])
        tasks.append(
            TaskSpec(
                name=n,
                stages=[s.name for s in stages],
                kinds=kinds_of[n],
                group=group_of[n],
                phase=phase[n],
                fused=fused,
                streaming=streaming,
                shared_forward=graph.shared_actor_critic and "old_logprob" in ks,
                depends_on=deps[n],
                after=after,
                concurrent_with=conc,
                micro_batch_size=plan.units[n].micro_batch_size,
            )
        )
    w = config.workload
    for g in groups.values():
        per_rank = (w.num_prompts // g.world_size) * w.samples_per_prompt
        if g.world_size > w.num_prompts:
            problems.append(
                Problem(
                    f"actor group {g.name}",
                    f"{g.world_size} data-parallel ranks but only {w.num_prompts} prompts per "
                    "step (each rank needs at least one whole prompt group)",
                )
            )
        elif g.trainable and w.num_prompts % g.world_size and per_rank < w.train_minibatches:
            # ranks would run different numbers of mini-batches: DDP collectives would hang
            problems.append(
                Problem(
                    f"actor group {g.name}",
                    f"uneven shards: a rank gets {per_rank} samples, fewer than "
                    f"workload.train_minibatches={w.train_minibatches}; use a num_prompts "
                    f"divisible by {g.world_size}",
                )
            )
    if problems:
        raise ConfigError(problems, title="plan refused before any actor starts")
    gen_groups = sorted({t.group for t in tasks if "generate" in t.kinds})
    train_group = next(t.group for t in tasks if "train_actor" in t.kinds)
    sync_targets = [g for g in gen_groups if g != train_group]
    weight_sync = {
        "mode": "bucketed" if sync_targets else "shared",
        "source": train_group,
        "targets": sync_targets,
        "every_steps": 1,
        "bucket_bytes": 4 << 20,
    }
    buffer = {
        "between": [t.name for t in tasks if t.phase == "rollout"],
        "and": [t.name for t in tasks if t.phase == "train"],
        "max_staleness": k,
        "samples_per_step": config.workload.samples_per_step,
        "off_policy_correction": config.algorithm.off_policy_correction,
    }
    return CompiledStep(
        pipeline=graph.algorithm,
        graph=graph.name,
        staleness=k,
        shared_actor_critic=bool(graph.shared_actor_critic),
        num_devices=len({d for g in groups.values() for d in g.devices}),
        actor_groups=list(groups.values()),
        tasks=tasks,
        weight_sync=weight_sync,
        buffer=buffer,
    )
