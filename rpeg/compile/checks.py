"""What the compiler refuses, as :class:`rpeg.errors.Problem` lists: a plan that does not fit
the graph or the cluster (:func:`plan_problems`), groups whose ranks cannot split the step's
prompts evenly (:func:`batch_problems`), and every field of a compiled step the runtime reads
(:func:`check_step`, also for a hand-edited compiled step). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rpeg.compile.step import (
    BACKENDS,
    DTYPES,
    FORWARD_KINDS,
    SUPPORTED_ROLES,
    CompiledStep,
    GroupSpec,
)
from rpeg.errors import ConfigError, Problem
from rpeg.plan.schema import PP_SCHEDULES
from rpeg.search.space import UNSUPPORTED_DEGREES

REFUSED = "plan refused before any actor starts"
#: why ``plan.partial_rollout`` is refused: what the performance model prices for it (AReaL's
#: interruptible rollout: sequences in flight across a weight update, re-prefilled on resume)
#: is not what the runtime does
PARTIAL_ROLLOUT_REFUSED = (
    "RPEG's runtime finishes every rollout on the weights it started with (bounded staleness "
    "k: a rollout lags by at most k versions); it does not interrupt rollouts at a weight "
    "update and resume them"
)

#: why ``seq_packing: true`` is refused on a unit at pp > 1 or cp > 1: the runtime's pipeline
#: stages exchange fixed-shape micro-batches and its context-parallel ranks split each row's
#: positions, so both run padded rows
PACKING_REFUSED = (
    "pipeline (pp > 1) and context-parallel (cp > 1) units run padded micro-batches in RPEG's "
    "runtime (pipeline stages exchange fixed-shape micro-batches; cp ranks split each row)"
)


#: the engines a unit of RPEG's runtime runs: its own trainer (``torch`` replicas, ``fsdp``)
#: and the generation engines (``torch``, ``vllm``; rpeg.runtime.engines.choice). The plan
#: schema's ``megatron`` and ``sglang`` price published systems (``rpeg validate``) only
RUNTIME_ENGINES = ("auto", "torch", "fsdp", "vllm")


def plan_problems(
    plan: Any, names: list[str], roles: list[tuple[str, str]], have: int
) -> list[Problem]:
    """Units the plan and the graph disagree on, roles the runtime lacks (``(stage, role)``
    pairs), more devices than the cluster's ``have``, and parallel degrees it cannot run."""
    out: list[Problem] = []
    for n in plan.units:
        if n not in names:
            out.append(
                Problem(
                    f"plan.units.{n}", f"unknown execution unit; the graph has: {', '.join(names)}"
                )
            )
    out += [
        Problem(f"plan.units.{n}", "missing: every execution unit needs devices")
        for n in names
        if n not in plan.units
    ]
    for stage, role in roles:
        if role not in SUPPORTED_ROLES:
            out.append(
                Problem(
                    f"stage {stage}",
                    f"unknown role {role!r} for the runtime; allowed: {', '.join(SUPPORTED_ROLES)}",
                )
            )
    need = plan.num_devices
    max_dev = max((d for u in plan.units.values() for d in u.devices), default=-1)
    if need > have or max_dev >= have:
        out.append(
            Problem(
                "plan",
                f"asks for {max(need, max_dev + 1)} devices (indices up to {max_dev}) but the cluster has {have}",
            )
        )
    if plan.partial_rollout:
        out.append(
            Problem(
                "plan.partial_rollout",
                f"true: {PARTIAL_ROLLOUT_REFUSED}; allowed: false (docs/compile.md)",
            )
        )
    for n, u in plan.units.items():
        if u.engine not in RUNTIME_ENGINES:
            out.append(
                Problem(
                    f"plan.units.{n}.engine",
                    f"{u.engine!r} prices a published system's engine (rpeg validate); RPEG's "
                    "runtime does not run it; allowed: auto, torch, fsdp (training and "
                    "forward units), vllm (generation)",
                )
            )
        for deg, why in UNSUPPORTED_DEGREES.items():
            v = getattr(u, deg)
            if v != 1:
                out.append(Problem(f"plan.units.{n}.{deg}", f"{deg}={v}: {why}; allowed: 1"))
    return out


def packing_problems(plan: Any, model: Any) -> list[Problem]:
    """``seq_packing: true`` where the runtime runs padded rows: a unit at pp > 1 or cp > 1,
    or a policy ``model`` (ModelSpec, None: unknown) with linear-attention layers, whose
    recurrent state would run from one packed sequence into the next."""
    out: list[Problem] = []
    for n, u in plan.units.items():
        if u.seq_packing is not True:
            continue
        why = ""
        if u.pp > 1 or u.cp > 1:
            why = f"at pp={u.pp}, cp={u.cp}: {PACKING_REFUSED}"
        elif getattr(model, "linear_attn", None) is not None:
            why = (
                f"model {model.name} has linear-attention layers, whose recurrent state "
                "would run from one packed sequence into the next"
            )
        if why:
            out.append(
                Problem(
                    f"plan.units.{n}.seq_packing",
                    f"true {why}; allowed: false, auto (docs/packing.md)",
                )
            )
    return out


def eager_problems(plan: Any, kinds_of: dict[str, Any]) -> list[Problem]:
    """``enforce_eager: true`` on a unit that generates nothing: the flag is the rollout
    engine's (decode without CUDA graphs), no other unit has an engine to give it to."""
    return [
        Problem(
            f"plan.units.{n}.enforce_eager",
            "true on a unit without a generate stage; allowed: false (the flag is the "
            "rollout engine's: decode without CUDA graphs)",
        )
        for n, u in plan.units.items()
        if u.enforce_eager and "generate" not in {str(k) for k in kinds_of.get(n, ())}
    ]


def batch_problems(groups: Iterable[GroupSpec], workload: Any) -> list[Problem]:
    """Each data-parallel rank needs a whole prompt group; sharded (or unevenly split)
    training ranks must run the same number of collectives."""
    from rpeg.compile.layouts import gen_dp

    w = workload
    out: list[Problem] = []
    for g in groups:
        for what, dp in (("data-parallel", g.dp), ("generation data-parallel", gen_dp(g))):
            if dp > w.num_prompts:
                out.append(
                    Problem(
                        f"actor group {g.name}",
                        f"{dp} {what} ranks but only {w.num_prompts} prompts per step "
                        "(each data-parallel rank needs at least one whole prompt group)",
                    )
                )
        per_rank = (w.num_prompts // g.dp) * w.samples_per_prompt
        if g.dp > w.num_prompts:
            continue
        if g.trainable and (g.fsdp or g.tp > 1 or g.ep > 1) and w.num_prompts % g.dp:
            # sharded training runs collectives in every forward: equal shards or a hang
            out.append(
                Problem(
                    f"actor group {g.name}",
                    f"dp={g.dp} does not divide workload.num_prompts={w.num_prompts} "
                    "(sharded ranks must see equal batches)",
                )
            )
        elif g.trainable and w.num_prompts % g.dp and per_rank < w.train_minibatches:
            # ranks would run different numbers of mini-batches: DDP collectives would hang
            out.append(
                Problem(
                    f"actor group {g.name}",
                    f"uneven shards: a rank gets {per_rank} samples, fewer than "
                    f"workload.train_minibatches={w.train_minibatches}; use a num_prompts "
                    f"divisible by {g.dp}",
                )
            )
    return out


def env_problems(graph: Any, config: Any) -> list[Problem]:
    """The graph's env stage and the config's ``task.multiturn.env`` agree: the env stage's
    environment is the config's (the rollout runs it inside the generate unit), and a
    multi-turn config's graph shows the env stage (docs/ir.md "Multi-turn: the env stage")."""
    from typing import get_args

    from rpeg.config.workload import EnvName

    has_env = bool(graph.env_stages)
    env = config.task.multiturn.env
    if has_env and not env:
        allowed = ", ".join(get_args(EnvName))
        return [
            Problem(
                "task.multiturn.env",
                f"graph {graph.name!r} has an env stage but no environment is set; allowed: "
                f"{allowed} (or a graph without an env stage)",
            )
        ]
    if env and not has_env:
        return [
            Problem(
                "plan.graph",
                f"task.multiturn.env is {env!r} but graph {graph.name!r} has no env stage: build it "
                "with the builder option multiturn: true (rpeg plan does so for this config)",
            )
        ]
    return []


def raise_if(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError(problems, title=REFUSED)


def _group_problems(step: CompiledStep) -> list[Problem]:
    ps: list[Problem] = []
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
        if min(g.tp, g.pp, g.cp, g.ep) < 1 or g.dp * g.replica_ranks != g.world_size:
            ps.append(
                Problem(
                    f"{where}.dp",
                    f"dp*pp*cp*tp={g.dp}*{g.pp}*{g.cp}*{g.tp} != world_size={g.world_size}",
                )
            )
        if g.ep > 1 and (g.dp * g.cp) % g.ep:
            ps.append(Problem(f"{where}.ep", f"ep={g.ep} does not divide dp*cp={g.dp * g.cp}"))
        if g.pp_schedule not in PP_SCHEDULES:
            ps.append(
                Problem(
                    f"{where}.pp_schedule",
                    f"{g.pp_schedule!r}; allowed: {', '.join(PP_SCHEDULES)}",
                )
            )
        if g.gen_tp < 1 or g.world_size % g.gen_tp:
            ps.append(
                Problem(f"{where}.gen_tp", f"{g.gen_tp} does not divide {g.world_size} ranks")
            )
        if g.fsdp and not g.trainable:
            ps.append(Problem(f"{where}.fsdp", "FSDP needs a trainable role in the group"))
        for knob in ("reshard_after_forward", "recompute"):
            if not isinstance(getattr(g, knob), bool):
                ps.append(
                    Problem(
                        f"{where}.{knob}",
                        f"{getattr(g, knob)!r}: must be true or false (a compiled step "
                        "holds the resolved setting)",
                    )
                )
    return ps


def _task_problems(step: CompiledStep) -> list[Problem]:
    ps: list[Problem] = []
    names = {t.name for t in step.tasks}
    gnames = {g.name for g in step.actor_groups}
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
        budget = t.max_tokens_per_micro_batch
        if budget is not None and (budget < 1 or not set(t.kinds) & FORWARD_KINDS):
            ps.append(
                Problem(
                    f"{where}.max_tokens_per_micro_batch",
                    f"{budget}: a positive budget on a unit with a forward pass; allowed: null",
                )
            )
        if t.fused != (len(t.stages) > 1):
            ps.append(
                Problem(f"{where}.fused", f"{t.fused} but the unit has {len(t.stages)} stage(s)")
            )
        if t.streaming and not t.generates:
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
    return ps


def _sync_problems(step: CompiledStep) -> list[Problem]:
    ps: list[Problem] = []
    ws = step.weight_sync
    k = step.staleness
    gnames = {g.name for g in step.actor_groups}
    if ws.mode not in ("shared", "bucketed"):
        ps.append(Problem("weight_sync.mode", f"{ws.mode!r}; allowed: shared, bucketed"))
    if ws.bucket_bytes < 1024:
        ps.append(Problem("weight_sync.bucket_bytes", f"{ws.bucket_bytes} < 1024"))
    if ws.every_steps < 1:
        ps.append(Problem("weight_sync.every_steps", f"{ws.every_steps} < 1"))
    elif ws.mode == "bucketed" and ws.every_steps > k + 1:
        ps.append(
            Problem(
                "weight_sync.every_steps",
                f"{ws.every_steps} > k+1={k + 1}: the generators would fall more than k={k} "
                "versions behind and every batch would be too stale (livelock)",
            )
        )
    if k < 0:
        ps.append(Problem("staleness", f"{k} < 0"))
    for g in (ws.source, *ws.targets):
        if g not in gnames:
            ps.append(Problem("weight_sync", f"unknown group {g!r}"))
    if step.buffer.samples_per_step < 1:
        ps.append(Problem("buffer.samples_per_step", f"{step.buffer.samples_per_step} < 1"))
    return ps


def check_step(step: CompiledStep) -> None:
    """Every field the runtime reads, checked; a ConfigError names each bad field. Run by
    :func:`rpeg.compile.compiler.compile_step` and by the runtime on a step it is handed."""
    ps = _group_problems(step) + _task_problems(step) + _sync_problems(step)
    if ps:
        raise ConfigError(ps, title="compiled step refused before any actor starts")
