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
  else ``bucketed`` from the trainer group to the generator group(s): a broadcast of the full
  weights in ``bucket_bytes`` buckets over a process group spanning the trainer's rank 0 and
  every generator rank, every ``every_steps`` updates.
* ``buffer``: the staleness bound ``max_staleness`` (k) every lag test of the runtime uses.

Layout of a group (docs/runtime.md "Compile"): its training unit gives ``tp``, ``dp`` and
``fsdp`` (engine ``fsdp``), its generate unit ``gen_tp``; a group without a training unit takes
its layout from its generate unit (else its first unit). A forward-only unit (log-probs,
values) whose tp differs from its group's runs on the group's layout (a group holds each role
in one shard layout) and the replacement is listed in ``notes``. ``pp``/``cp``/``ep`` > 1 are
refused (and removed from the search space, :mod:`rpeg.search.space`).

Every field the runtime reads is checked by :func:`check_step` (also for a hand-edited
compiled step): a value the runtime cannot honour is a ConfigError naming the field.

Pure: imports no torch, dask or prefect.
"""

from __future__ import annotations

import json
from typing import Any

from rpeg.compile.sources import available_devices, resolve
from rpeg.compile.step import (
    BACKENDS,
    DTYPES,
    FORWARD_KINDS,
    ROLLOUT_KINDS,
    SUPPORTED_ROLES,
    TRAINABLE_KINDS,
    ActorGroupSpec,
    CompiledStep,
    TaskSpec,
)
from rpeg.errors import ConfigError, Problem
from rpeg.search.space import UNSUPPORTED_DEGREES


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
    from rpeg.ir import validate

    validate(graph)
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
        for deg, why in UNSUPPORTED_DEGREES.items():
            v = getattr(u, deg)
            if v != 1:
                problems.append(Problem(f"plan.units.{n}.{deg}", f"{deg}={v}: {why}; allowed: 1"))
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
    notes: list[str] = []
    _group_layouts(groups, info, kinds_of, plan, config, notes, problems)
    if problems:
        raise ConfigError(problems, title="plan refused before any actor starts")

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
                micro_batch_size=_micro_batch(plan.units[n].micro_batch_size, ks),
                stream_chunk_prompts=_chunk(config, groups, group_of[n]) if streaming else 0,
            )
        )
    w = config.workload
    for g in groups.values():
        for what, dp in (("data-parallel", g.dp), ("generation data-parallel", _gen_dp(g))):
            if dp > w.num_prompts:
                problems.append(
                    Problem(
                        f"actor group {g.name}",
                        f"{dp} {what} ranks but only {w.num_prompts} prompts per step "
                        "(each data-parallel rank needs at least one whole prompt group)",
                    )
                )
        per_rank = (w.num_prompts // g.dp) * w.samples_per_prompt
        if g.dp > w.num_prompts:
            continue
        if g.trainable and (g.fsdp or g.tp > 1) and w.num_prompts % g.dp:
            # sharded training runs collectives in every forward: equal shards or a hang
            problems.append(
                Problem(
                    f"actor group {g.name}",
                    f"dp={g.dp} does not divide workload.num_prompts={w.num_prompts} "
                    "(sharded ranks must see equal batches)",
                )
            )
        elif g.trainable and w.num_prompts % g.dp and per_rank < w.train_minibatches:
            # ranks would run different numbers of mini-batches: DDP collectives would hang
            problems.append(
                Problem(
                    f"actor group {g.name}",
                    f"uneven shards: a rank gets {per_rank} samples, fewer than "
                    f"workload.train_minibatches={w.train_minibatches}; use a num_prompts "
                    f"divisible by {g.dp}",
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
        "off_policy_correction": config.algorithm.rollout_correction.mode,
    }
    step = CompiledStep(
        pipeline=graph.algorithm,
        graph=graph.name,
        staleness=k,
        shared_actor_critic=bool(graph.shared_actor_critic),
        num_devices=len({d for g in groups.values() for d in g.devices}),
        actor_groups=list(groups.values()),
        tasks=tasks,
        weight_sync=weight_sync,
        buffer=buffer,
        notes=notes,
    )
    check_step(step)
    return step


# --------------------------------------------------------------------------- layouts


def model_shape(config: Any) -> dict[str, int]:
    """Heads, kv heads and MLP width of the run's policy: the model folder's ``config.json``
    when it is a local path, else the catalog entry of ``model.name`` (with the built-in tiny
    model's ``tiny_shape`` overrides)."""
    m = config.model
    keys = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
    cfg = _config_json(m)
    if cfg is not None:
        return {k: int(cfg[k]) for k in keys if isinstance(cfg.get(k), int)}
    out: dict[str, int] = {}
    try:
        from rpeg import specs

        spec = specs.model(m.name)
        out = {
            "num_attention_heads": int(spec.heads),
            "num_key_value_heads": int(getattr(spec, "kv_heads", None) or spec.heads),
            "intermediate_size": int(spec.ffn_hidden),
        }
    except Exception:  # noqa: BLE001 -- an unknown catalog name: nothing to check against
        out = {}
    if m.path is None and m.tiny_shape:
        out.update({k: int(v) for k, v in m.tiny_shape.items() if k in keys})
    return out


def _config_json(m: Any) -> dict | None:
    """The HF ``config.json`` of ``model.path`` when it is a local folder holding one."""
    import os

    if not (m.path and os.path.isfile(os.path.join(m.path, "config.json"))):
        return None
    with open(os.path.join(m.path, "config.json")) as fh:
        return json.load(fh)


def _policy_model(config: Any) -> Any:
    """The policy's catalog spec: the model folder's ``config.json`` when it is a local path,
    else the catalog entry of ``model.name``; None when neither can be read."""
    from rpeg import specs
    from rpeg.specs.hf import entry_from_hf
    from rpeg.specs.models import parse_models

    m = config.model
    try:
        cfg = _config_json(m)
        if cfg is not None:
            entry = entry_from_hf(cfg)
            return parse_models([({"models": {"policy": entry}}, m.path)])["policy"]
        return specs.model(m.name)
    except Exception:  # noqa: BLE001 -- an unreadable or unknown model: nothing to size
        return None


def _keeps_gathered(config: Any, up: Any, dtype: str) -> bool:
    """The training unit ``up``'s ``reshard_after_forward`` resolved: an explicit bool as
    given; ``auto`` by the performance model's rule (:func:`rpeg.perf.units.keeps_gathered`:
    the gathered extra fits a share of the cluster's device memory), resharding (the
    memory-safe choice) when the model or cluster cannot be sized."""
    from rpeg import specs
    from rpeg.perf.units import gathered_extra_gb, keeps_gathered, params_per_device

    setting = up.reshard_after_forward
    if setting != "auto":
        return not setting
    model = _policy_model(config)
    try:
        device_gb = specs.cluster(config.cluster.name).gpu.usable_hbm_gb
    except Exception:  # noqa: BLE001
        return False
    if model is None:
        return False
    dp = max(1, up.num_devices // (up.tp * up.pp))
    wbytes = 4.0 if dtype == "float32" else 2.0
    extra = gathered_extra_gb(params_per_device(model, up.tp, up.pp, up.ep), wbytes, dp)
    return keeps_gathered(setting, extra, device_gb)


def _device_type(config: Any) -> str:
    """``cuda`` unless the catalog cluster's device is the CPU. An unknown cluster name is
    the catalog's error (a SpecError naming the known clusters), never a silent ``cpu``."""
    from rpeg import specs

    cl = specs.cluster(config.cluster.name)
    return "cpu" if cl.gpu.name == "cpu" else "cuda"


def _dtype(config: Any, device_type: str) -> str:
    prec = str(config.workload.precision)
    if prec in ("bf16", "bfloat16"):
        return "bfloat16"
    if prec in ("fp16", "float16"):
        return "float16"
    if device_type == "cuda" and config.model.dtype == "float32" and prec != "fp32":
        return "bfloat16"
    return "float32" if prec == "fp32" else config.model.dtype


def _gen_dp(g: ActorGroupSpec) -> int:
    """Data-parallel size of generation on the group (``gen_tp`` = ``tp`` without one)."""
    return max(1, g.world_size // max(1, g.gen_tp))


def _group_layouts(
    groups: dict[tuple[int, ...], ActorGroupSpec],
    info: list[Any],
    kinds_of: dict[str, list[str]],
    plan: Any,
    config: Any,
    notes: list[str],
    problems: list[Problem],
) -> dict[str, int]:
    """Fill every group's layout from its units (module docstring); returns unit -> tp run."""
    dev = _device_type(config)
    dtype = _dtype(config, dev)
    shape = model_shape(config)
    by_name = {g.name: g for g in groups.values()}
    unit_tp: dict[str, int] = {}
    for g in by_name.values():
        units = g.units
        train = [n for n in units if set(kinds_of[n]) & set(TRAINABLE_KINDS)]
        gen = [n for n in units if "generate" in kinds_of[n]]
        model_units = [n for n in units if set(kinds_of[n]) & FORWARD_KINDS]
        lead = train[0] if train else (gen[0] if gen else (model_units or units)[0])
        up = plan.units[lead]
        g.tp = up.tp
        g.dp = max(1, g.world_size // up.tp)
        g.fsdp = bool(train) and up.engine == "fsdp"
        g.gen_tp = plan.units[gen[0]].tp if gen else g.tp
        g.gen_memory_utilization = plan.units[gen[0]].gpu_memory_utilization if gen else None
        g.device_type = dev
        g.dtype = dtype
        g.reshard_after_forward = not (g.fsdp and g.dp > 1 and _keeps_gathered(config, up, dtype))
        g.backend = "nccl" if dev == "cuda" else "gloo"
        for n in units:
            t = plan.units[n].tp
            runs = g.gen_tp if n in gen else g.tp
            unit_tp[n] = runs
            if (
                t != runs
                and n not in gen
                and set(kinds_of[n]) & (FORWARD_KINDS | set(TRAINABLE_KINDS))
            ):
                if train and n in train:
                    problems.append(
                        Problem(
                            f"plan.units.{n}.tp",
                            f"tp={t} but the group's training unit {train[0]} has tp={g.tp}: "
                            "two training layouts on one group",
                        )
                    )
                else:
                    notes.append(
                        f"plan.units.{n}.tp={t}: runs at group {g.name}'s layout tp={runs} "
                        f"(set by {lead}; a group holds each role in one shard layout)"
                    )
        for t in {g.tp, g.gen_tp}:
            if t > 1:
                for key, val in shape.items():
                    if val % t:
                        problems.append(
                            Problem(
                                f"actor group {g.name} (units {', '.join(units)})",
                                f"tp={t} does not divide the model's {key}={val}",
                            )
                        )
    return unit_tp


def _micro_batch(size: int, kinds: set[str]) -> int:
    """The plan's micro-batch size for a unit with a forward pass; 1 for the units that run
    none (reward, advantage, weight sync: one pass over the rank's rows, whatever the plan
    builders put there). Generation keeps the plan's value: check_step refuses it unless 1."""
    if kinds & FORWARD_KINDS or "generate" in kinds:
        return size
    return 1


def _chunk(config: Any, groups: dict[tuple[int, ...], ActorGroupSpec], group: str) -> int:
    """Prompt groups per streamed chunk: a quarter of a rank's prompts (at least one)."""
    g = next(x for x in groups.values() if x.name == group)
    per_rank = max(1, config.workload.num_prompts // _gen_dp(g))
    return max(1, per_rank // 4)


def check_step(step: CompiledStep) -> None:
    """Every field the runtime reads, checked; a ConfigError names each bad field. Run by
    :func:`compile_step` and by the runtime on a compiled step it is handed."""
    ps: list[Problem] = []
    names = {t.name for t in step.tasks}
    gnames = {g.name for g in step.actor_groups}
    for i, g in enumerate(step.actor_groups):
        where = f"actor_groups[{i}] ({g.name})"
        if g.device_type not in BACKENDS:
            ps.append(Problem(f"{where}.device_type", f"{g.device_type!r}; allowed: cpu, cuda"))
        elif g.backend not in BACKENDS[g.device_type]:
            ps.append(
                Problem(
                    f"{where}.backend",
                    f"{g.backend!r} on {g.device_type}; allowed: {', '.join(BACKENDS[g.device_type])}",
                )
            )
        if g.dtype not in DTYPES:
            ps.append(Problem(f"{where}.dtype", f"{g.dtype!r}; allowed: {', '.join(DTYPES)}"))
        if g.world_size != len(g.devices):
            ps.append(Problem(f"{where}.world_size", f"{g.world_size} != {len(g.devices)} devices"))
        if g.tp < 1 or g.dp * g.tp != g.world_size:
            ps.append(Problem(f"{where}.dp", f"dp*tp={g.dp}*{g.tp} != world_size={g.world_size}"))
        if g.gen_tp < 1 or g.world_size % g.gen_tp:
            ps.append(
                Problem(f"{where}.gen_tp", f"{g.gen_tp} does not divide {g.world_size} ranks")
            )
        if g.fsdp and not g.trainable:
            ps.append(Problem(f"{where}.fsdp", "FSDP needs a trainable role in the group"))
        if not isinstance(g.reshard_after_forward, bool):
            ps.append(
                Problem(
                    f"{where}.reshard_after_forward",
                    f"{g.reshard_after_forward!r}: must be true or false (a compiled step "
                    "holds the resolved setting)",
                )
            )
    for i, t in enumerate(step.tasks):
        where = f"tasks[{i}] ({t.name})"
        if t.group not in gnames:
            ps.append(Problem(f"{where}.group", f"unknown group {t.group!r}"))
        if t.micro_batch_size < 1:
            ps.append(Problem(f"{where}.micro_batch_size", f"{t.micro_batch_size} < 1"))
        elif t.micro_batch_size != 1 and not set(t.kinds) & FORWARD_KINDS:
            ps.append(
                Problem(
                    f"{where}.micro_batch_size",
                    f"{t.micro_batch_size}: the unit runs no forward pass ({'+'.join(t.kinds)}; "
                    "generation batches all of a rank's prompts in one engine call); allowed: 1",
                )
            )
        if t.fused != (len(t.stages) > 1):
            ps.append(
                Problem(f"{where}.fused", f"{t.fused} but the unit has {len(t.stages)} stage(s)")
            )
        if t.streaming and "generate" not in t.kinds:
            ps.append(Problem(f"{where}.streaming", "only a unit with generation streams"))
        for other in t.concurrent_with:
            if other not in names:
                ps.append(Problem(f"{where}.concurrent_with", f"unknown unit {other!r}"))
            elif step.task(other).group == t.group:
                ps.append(
                    Problem(
                        f"{where}.concurrent_with",
                        f"{other} runs on the same actor group {t.group}: cannot overlap",
                    )
                )
    ws = step.weight_sync
    if ws.get("mode") not in ("shared", "bucketed"):
        ps.append(Problem("weight_sync.mode", f"{ws.get('mode')!r}; allowed: shared, bucketed"))
    if int(ws.get("bucket_bytes", 0)) < 1024:
        ps.append(Problem("weight_sync.bucket_bytes", f"{ws.get('bucket_bytes')} < 1024"))
    every = int(ws.get("every_steps", 0))
    k = int(step.buffer.get("max_staleness", -1))
    if every < 1:
        ps.append(Problem("weight_sync.every_steps", f"{every} < 1"))
    elif ws.get("mode") == "bucketed" and every > k + 1:
        ps.append(
            Problem(
                "weight_sync.every_steps",
                f"{every} > k+1={k + 1}: the generators would fall more than k={k} versions "
                "behind and every batch would be too stale (livelock)",
            )
        )
    if k < 0:
        ps.append(Problem("buffer.max_staleness", f"{k} < 0"))
    elif k != step.staleness:
        ps.append(Problem("buffer.max_staleness", f"{k} != staleness={step.staleness}"))
    for g in [ws.get("source"), *ws.get("targets", [])]:
        if g is not None and g not in gnames:
            ps.append(Problem("weight_sync", f"unknown group {g!r}"))
    if ps:
        raise ConfigError(ps, title="compiled step refused before any actor starts")
