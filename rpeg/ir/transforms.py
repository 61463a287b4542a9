"""Structural transforms: pure rewrites that return a new, validated graph.

Each refuses (GraphError naming the reason) when the rewrite makes no sense for the graph.
They compose: ``bound_async(fuse(share_actor_critic(ppo()), [...]), 1)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rpeg.errors import Problem
from rpeg.ir.checks import validate
from rpeg.ir.graph import (
    WEIGHTS_STATE,
    FusedGroup,
    Graph,
    GraphError,
    Role,
    Stage,
    StageKind,
)


def _fail(where: str, what: str) -> GraphError:
    return GraphError([Problem(where, what)])


def _union(*seqs: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for s in seqs for x in s))


def bound_async(g: Graph, k: int) -> Graph:
    """Set the staleness bound ``k`` (weights made at step t feed generation at t+1+k)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise _fail("bound_async", f"staleness k must be an integer >= 0, got {k!r}")
    if not any(e.state == WEIGHTS_STATE for e in g.state_edges):
        raise _fail("bound_async", "the graph has no 'weights' state edge to bound")
    edges = tuple(
        dataclasses.replace(e, staleness=k) if e.state == WEIGHTS_STATE else e
        for e in g.state_edges
    )
    return validate(dataclasses.replace(g, state_edges=edges))


def share_actor_critic(g: Graph) -> Graph:
    """One trunk with policy and value heads (PPO).

    The ``values`` stage merges into ``old_logprob`` (one forward writes old_logprobs and
    values, role actor); ``train_critic`` merges into ``train_actor`` (one update). The critic
    weights state edge disappears; fused groups and colocation sets are rewritten to the
    surviving stages / the actor role.
    """
    if g.shared_actor_critic:
        raise _fail("share_actor_critic", "actor and critic are already shared")
    values = g.stages_of_kind(StageKind.values)
    critics = g.stages_of_kind(StageKind.train_critic)
    olds = g.stages_of_kind(StageKind.old_logprob)
    trains = g.stages_of_kind(StageKind.train_actor)
    if not values or not critics:
        raise _fail(
            "share_actor_critic",
            f"the {g.algorithm} graph has no critic (needs values and train_critic stages)",
        )
    if len(values) != 1 or len(critics) != 1 or len(olds) != 1 or len(trains) != 1:
        raise _fail(
            "share_actor_critic",
            "needs exactly one values, train_critic, old_logprob and train_actor stage",
        )
    v, c, o, t = values[0], critics[0], olds[0], trains[0]
    merged_fwd = dataclasses.replace(
        o, reads=_union(o.reads, v.reads), writes=_union(o.writes, v.writes)
    )
    t_reads = _union(t.reads, c.reads)
    merged_train = dataclasses.replace(
        t,
        reads=t_reads,
        writes=tuple(f for f in _union(t.writes, c.writes) if f != "critic_weights"),
    )
    rename = {v.name: o.name, c.name: t.name}
    stages: list[Stage] = []
    for s in g.stages:
        if s.name in (v.name, c.name):
            continue
        if s.name == o.name:
            stages.append(merged_fwd)
        elif s.name == t.name:
            stages.append(merged_train)
        else:
            stages.append(
                dataclasses.replace(s, reads=tuple(f for f in s.reads if f != "critic_weights"))
            )
    state = tuple(
        dataclasses.replace(e, src=rename.get(e.src, e.src), dst=rename.get(e.dst, e.dst))
        for e in g.state_edges
        if e.state != "critic_weights" and not (e.src in rename and e.dst in rename)
    )
    fused = []
    for grp in g.fused:
        members = tuple(dict.fromkeys(rename.get(s, s) for s in grp.stages))
        if len(members) >= 2:
            fused.append(dataclasses.replace(grp, stages=members))
    colocated = []
    for roles in g.colocated:
        rs = frozenset(Role.actor if r == Role.critic else r for r in roles)
        if len(rs) >= 2:
            colocated.append(rs)
    return validate(
        dataclasses.replace(
            g,
            stages=tuple(stages),
            state_edges=state,
            fused=tuple(fused),
            colocated=tuple(colocated),
            shared_actor_critic=True,
        )
    )


def fuse(
    g: Graph,
    stages: Iterable[str] | str,
    *,
    streaming: bool = False,
    name: str | None = None,
) -> Graph:
    """Run ``stages`` back to back in one process, in the given order.

    They must exist, not already be fused, respect their data dependencies and be contiguous
    in some topological order. ``streaming`` (sample-level hand-off) needs the group to start
    with the generate stage.
    """
    members = (
        tuple(s.strip() for s in stages.split(",")) if isinstance(stages, str) else tuple(stages)
    )
    members = tuple(s for s in members if s)
    problems: list[Problem] = []
    where = f"fuse {','.join(members)}"
    if len(members) < 2:
        problems.append(Problem(where, "fusion needs at least 2 stages"))
    for s in members:
        if not g.has_stage(s):
            known = ", ".join(x.name for x in g.stages)
            problems.append(Problem(where, f"unknown stage {s!r} (known stages: {known})"))
        elif (grp := g.group_of(s)) is not None:
            problems.append(Problem(where, f"stage {s!r} is already in fused group {grp.name!r}"))
    gname = name or "+".join(members)
    if any(grp.name == gname for grp in g.fused):
        problems.append(Problem(where, f"a fused group named {gname!r} already exists"))
    if problems:
        raise GraphError(problems)
    new = dataclasses.replace(g, fused=(*g.fused, FusedGroup(gname, members, streaming)))
    return validate(new)


def unfuse(g: Graph, name: str) -> Graph:
    """Remove the fused group ``name``."""
    g.group(name)
    return validate(dataclasses.replace(g, fused=tuple(x for x in g.fused if x.name != name)))


def colocate(g: Graph, roles: Iterable[Role | str] | str) -> Graph:
    """Record that ``roles`` time-share the same devices (merged with overlapping sets)."""
    raw = [r.strip() for r in roles.split(",")] if isinstance(roles, str) else list(roles)
    problems: list[Problem] = []
    rs: set[Role] = set()
    for r in raw:
        try:
            rs.add(Role(r))
        except ValueError:
            problems.append(
                Problem(
                    "colocate", f"unknown role {r!r} (roles: {', '.join(x.value for x in Role)})"
                )
            )
    for r in sorted(rs, key=lambda r: r.value):
        if r not in g.roles:
            used = ", ".join(sorted(x.value for x in g.roles))
            problems.append(
                Problem("colocate", f"role {r.value!r} is not used by any stage (used: {used})")
            )
    if len(rs) < 2 and not problems:
        problems.append(Problem("colocate", "colocation needs at least 2 distinct roles"))
    if problems:
        raise GraphError(problems)
    keep = []
    merged = frozenset(rs)
    for s in g.colocated:
        if s & merged:
            merged |= s
        else:
            keep.append(s)
    return validate(dataclasses.replace(g, colocated=(*keep, merged)))


def separate(g: Graph, role: Role | str) -> Graph:
    """Take ``role`` out of any colocation set (it gets its own devices)."""
    role = Role(role)
    out = []
    for s in g.colocated:
        rest = s - {role}
        if len(rest) >= 2:
            out.append(frozenset(rest))
    return validate(dataclasses.replace(g, colocated=tuple(out)))
