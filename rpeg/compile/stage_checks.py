"""What the compiler refuses of pipeline (pp) and context (cp) parallelism, by name: the
layouts the runtime's ranks cannot run (rpeg.runtime.parallel_layout, rpeg.runtime.pipeline,
rpeg.runtime.context_parallel). Pure: the search space drops layouts by the same rules
(:func:`rpeg.search.stage_rules.layout_refusal`), so the planner emits only what runs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rpeg.errors import Problem
from rpeg.search.stage_rules import PP_CHUNKS, layout_refusal

if TYPE_CHECKING:
    from rpeg.compile.step import GroupSpec
    from rpeg.ir import StageKind


def stage_problems(
    groups: Iterable[GroupSpec],
    kinds_of: Mapping[str, tuple[StageKind, ...]],
    plan: Any,
    config: Any,
    model: Any,
) -> list[Problem]:
    """Every compiled group's pp/cp that the runtime cannot run (``model``: the policy's spec
    at the shape that runs, or None)."""
    from rpeg.ir import StageKind

    out: list[Problem] = []
    for g in groups:
        where = f"actor group {g.name} (units {', '.join(g.units)})"
        for n in g.units:
            u = plan.units[n]
            if StageKind.generate in kinds_of[n] and (u.pp > 1 or u.cp > 1):
                out.append(
                    Problem(
                        f"plan.units.{n}",
                        f"pp={u.pp}, cp={u.cp} on a generate unit: generation runs on whole "
                        "(or tp-split) weights, not pipeline stages or sequence shards; "
                        "allowed: pp=1, cp=1",
                    )
                )
        if g.pp <= 1 and g.cp <= 1:
            continue
        deg = f"pp={g.pp}" if g.pp > 1 else f"cp={g.cp}"
        if "critic" in g.roles:
            out.append(
                Problem(
                    where,
                    f"{deg} with a critic (value model) in the group: the critic is not "
                    "pipelined or sequence-sharded; allowed: pp=1, cp=1 on the critic's group",
                )
            )
        if g.fsdp and g.dp > 1 and g.pp > 1:
            out.append(
                Problem(
                    where,
                    f"{deg} with engine fsdp: pipeline stages keep dp replicas; allowed: "
                    "engine auto (FSDP composes with cp: sharded over the dp x cp ranks)",
                )
            )
        if g.cp > 1 and (g.tp > 1 or g.pp > 1):
            out.append(
                Problem(
                    where,
                    f"cp={g.cp} with tp={g.tp}, pp={g.pp}: context parallelism composes with "
                    "dp only; allowed: tp=1, pp=1 with cp > 1",
                )
            )
        if g.pp > 1 and str(config.workload.precision) in ("fp16", "float16"):
            out.append(
                Problem(
                    where,
                    f"{deg} with fp16 loss scaling is not run; allowed: fp32, bf16 (or pp=1)",
                )
            )
        if g.pp > 1 and bool(getattr(config.algorithm, "share_actor_critic", False)):
            out.append(Problem(where, f"{deg} with a shared value head; allowed: pp=1"))
        why = layout_refusal(model, g.pp, g.cp, 1, g.pp_schedule)
        if why and model is not None:
            v = PP_CHUNKS.get(g.pp_schedule, 1)
            out.append(
                Problem(
                    where,
                    f"{deg} ({g.pp_schedule}) on {model.name} ({model.family}, "
                    f"{model.layers} layers{', MoE' if model.moe else ''}): "
                    f"{why.removeprefix('runtime: ')}"
                    + (f" (needs >= {g.pp * v} layers)" if "layers" in why else ""),
                )
            )
    return out


def stage_notes(
    groups: Iterable[GroupSpec], kinds_of: Mapping[str, tuple[StageKind, ...]], plan: Any
) -> tuple[list[str], list[Problem]]:
    """Forward-only units whose own pp/cp the group's layout replaces (a group holds each
    role in one layout: the one of its training unit, rpeg.compile.layouts) as notes; a
    second training unit at another pp/cp is a problem (two training layouts on one group)."""
    from rpeg.compile.step import FORWARD_KINDS, TRAINABLE_KINDS
    from rpeg.ir import StageKind

    notes: list[str] = []
    problems: list[Problem] = []
    for g in groups:
        train = [n for n in g.units if set(kinds_of[n]) & set(TRAINABLE_KINDS)]
        for n in g.units:
            u = plan.units[n]
            ks = set(kinds_of[n])
            if StageKind.generate in ks or not ks & (FORWARD_KINDS | set(TRAINABLE_KINDS)):
                continue
            if (u.pp, u.cp) == (g.pp, g.cp) and (u.pp == 1 or u.pp_schedule == g.pp_schedule):
                continue
            mine = f"pp={u.pp}, cp={u.cp}" + (f" ({u.pp_schedule})" if u.pp > 1 else "")
            group = f"pp={g.pp}, cp={g.cp}" + (f" ({g.pp_schedule})" if g.pp > 1 else "")
            if n in train:
                problems.append(
                    Problem(
                        f"plan.units.{n}",
                        f"{mine} but the group's training unit {train[0]} has {group}: two "
                        "training layouts on one group",
                    )
                )
            else:
                notes.append(
                    f"plan.units.{n}: {mine} runs at group {g.name}'s layout {group} (a group "
                    "holds each role in one layout: its training unit's)"
                )
    return notes, problems
