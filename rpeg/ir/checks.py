"""Every check of a graph, each problem naming the stage, field, edge or group it is about:
:func:`problems` lists them, :func:`validate` raises :class:`GraphError` when there is one."""

from __future__ import annotations

from collections import Counter
from numbers import Real

import networkx as nx

from rpeg.errors import Problem
from rpeg.ir.graph import (
    FIELDS,
    KIND_ROLES,
    LOSS_AGGREGATIONS,
    WEIGHTS_STATE,
    Graph,
    GraphError,
    Role,
    StageKind,
)
from rpeg.ir.recipes import KL_PLACEMENTS
from rpeg.ir.turn_checks import turn_problems


def _role_name(role: Role | None) -> str:
    return "none" if role is None else role.value


def _known_fields() -> str:
    return ", ".join(FIELDS)


def validate(g: Graph) -> Graph:
    """Return ``g`` if it is valid, else raise GraphError listing every problem."""
    found = problems(g)
    if found:
        raise GraphError(found)
    return g


def problems(g: Graph) -> list[Problem]:
    """Every problem of the graph (empty when valid)."""
    p: list[Problem] = []
    if not isinstance(g.name, str) or not g.name:
        p.append(Problem("name", "graph name must be a non-empty string"))
    if not isinstance(g.algorithm, str) or not g.algorithm:
        p.append(Problem("algorithm", "algorithm must be a non-empty string"))
    p += _stage_problems(g)
    p += _field_problems(g)
    has_cycle = _cycle_problems(g, p)
    p += _state_problems(g)
    p += _fused_problems(g, has_cycle)
    p += turn_problems(g)
    p += _colocation_problems(g)
    p += _sharing_problems(g)
    p += _param_problems(g)
    return p


# --------------------------------------------------------------------------- stages


def _stage_problems(g: Graph) -> list[Problem]:
    p: list[Problem] = []
    counts = Counter(s.name for s in g.stages)
    for name, n in counts.items():
        if n > 1:
            p.append(Problem(f"stage {name}", f"duplicate stage name ({n} stages share it)"))
    for i, s in enumerate(g.stages):
        where = f"stage {s.name}" if s.name else f"stages[{i}]"
        if not s.name:
            p.append(Problem(where, "stage name must be a non-empty string"))
        allowed = set(KIND_ROLES[s.kind])
        if g.shared_actor_critic and s.kind == StageKind.values:
            allowed.add(Role.actor)
        if s.role not in allowed:
            names = ", ".join(sorted(_role_name(r) for r in allowed))
            p.append(
                Problem(
                    f"{where}.role",
                    f"role {_role_name(s.role)} is not allowed for a {s.kind} stage (allowed: {names})",
                )
            )
        for attr in ("reads", "writes"):
            fields = getattr(s, attr)
            for f in fields:
                if f not in FIELDS:
                    p.append(
                        Problem(
                            f"{where}.{attr}",
                            f"unknown field {f!r} (known fields: {_known_fields()})",
                        )
                    )
            for f, n in Counter(fields).items():
                if n > 1:
                    p.append(Problem(f"{where}.{attr}", f"field {f!r} listed {n} times"))
        for f in set(s.reads) & set(s.writes):
            p.append(Problem(where, f"reads and writes the same field {f!r} (a cycle)"))
    if not g.stages_of_kind(StageKind.generate):
        p.append(Problem("stages", "the graph has no generate stage"))
    if not g.stages_of_kind(StageKind.train_actor):
        p.append(Problem("stages", "the graph has no train_actor stage"))
    return p


def _field_problems(g: Graph) -> list[Problem]:
    p: list[Problem] = []
    writers: dict[str, list[str]] = {}
    for s in g.stages:
        for f in dict.fromkeys(s.writes):
            writers.setdefault(f, []).append(s.name)
    for f, ws in writers.items():
        if len(ws) > 1:
            p.append(Problem(f"field {f}", f"written by more than one stage: {', '.join(ws)}"))
    for f in g.inputs:
        if f not in FIELDS:
            p.append(Problem("inputs", f"unknown field {f!r} (known fields: {_known_fields()})"))
        if f in writers:
            p.append(Problem("inputs", f"input field {f!r} is also written by {writers[f][0]}"))
    inputs = set(g.inputs)
    for s in g.stages:
        for f in s.reads:
            if f not in writers and f not in inputs and f in FIELDS:
                p.append(
                    Problem(
                        f"stage {s.name}.reads",
                        f"field {f!r} is consumed but never produced (no stage writes it and "
                        f"it is not a graph input; inputs: {', '.join(g.inputs) or 'none'})",
                    )
                )
    return p


def _cycle_problems(g: Graph, out: list[Problem]) -> bool:
    d = g.dag()
    found = False
    for comp in nx.strongly_connected_components(d):
        if len(comp) < 2:
            continue
        found = True
        cyc = nx.find_cycle(d.subgraph(comp))
        path = " -> ".join([cyc[0][0], *(v for _, v in cyc)])
        fields = "; ".join(f"{u}->{v}: {', '.join(d[u][v]['fields'])}" for u, v in cyc)
        out.append(Problem("graph", f"cycle within a step: {path} (fields {fields})"))
    return found


# --------------------------------------------------------------------------- state edges


def _state_problems(g: Graph) -> list[Problem]:
    p: list[Problem] = []
    seen: Counter = Counter()
    for i, e in enumerate(g.state_edges):
        where = f"state_edges[{i}] ({e.src} -> {e.dst}, {e.state})"
        seen[(e.src, e.dst, e.state)] += 1
        for end in (e.src, e.dst):
            if not g.has_stage(end):
                known = ", ".join(s.name for s in g.stages)
                p.append(Problem(where, f"unknown stage {end!r} (known stages: {known})"))
        if not isinstance(e.staleness, int) or isinstance(e.staleness, bool):
            p.append(Problem(where, f"staleness must be an integer, got {e.staleness!r}"))
        elif e.staleness < 0:
            p.append(Problem(where, f"staleness must be >= 0, got {e.staleness}"))
        if not e.state:
            p.append(Problem(where, "state name must be non-empty"))
        if e.state == WEIGHTS_STATE and g.has_stage(e.src) and g.has_stage(e.dst):
            src, dst = g.stage(e.src), g.stage(e.dst)
            if src.kind not in (StageKind.train_actor, StageKind.sync_weights):
                p.append(
                    Problem(
                        where,
                        f"weights must come from train_actor or sync_weights, not a {src.kind} stage",
                    )
                )
            if dst.kind != StageKind.generate:
                p.append(
                    Problem(where, f"weights must go to a generate stage, not a {dst.kind} stage")
                )
    for (src, dst, state), n in seen.items():
        if n > 1:
            p.append(Problem("state_edges", f"duplicate state edge {src} -> {dst} ({state})"))
    ks = {
        e.staleness
        for e in g.state_edges
        if e.state == WEIGHTS_STATE and isinstance(e.staleness, int)
    }
    if len(ks) > 1:
        detail = ", ".join(
            f"{e.src}->{e.dst} k={e.staleness}" for e in g.state_edges if e.state == WEIGHTS_STATE
        )
        p.append(
            Problem(
                "state_edges",
                f"inconsistent staleness on the weights edges: {detail}; they must agree",
            )
        )
    if g.stages_of_kind(StageKind.generate) and not any(
        e.state == WEIGHTS_STATE for e in g.state_edges
    ):
        p.append(
            Problem(
                "state_edges",
                "no 'weights' state edge into generate: updated policy weights never reach generation",
            )
        )
    return p


# --------------------------------------------------------------------------- fusion


def _fused_problems(g: Graph, has_cycle: bool) -> list[Problem]:
    p: list[Problem] = []
    d = g.dag()
    for name, n in Counter(grp.name for grp in g.fused).items():
        if n > 1:
            p.append(Problem(f"fused {name}", "duplicate fused group name"))
    owner: dict[str, str] = {}
    clean = True
    for i, grp in enumerate(g.fused):
        where = f"fused {grp.name}" if grp.name else f"fused[{i}]"
        if not grp.name:
            p.append(Problem(where, "group name must be a non-empty string"))
        if len(grp.stages) < 2:
            p.append(
                Problem(where, f"a fused group needs at least 2 stages, got {list(grp.stages)}")
            )
        ok = True
        for s, n in Counter(grp.stages).items():
            if n > 1:
                p.append(Problem(where, f"stage {s!r} listed {n} times"))
                ok = False
            if not g.has_stage(s):
                known = ", ".join(x.name for x in g.stages)
                p.append(Problem(where, f"unknown stage {s!r} (known stages: {known})"))
                ok = False
            elif s in owner and owner[s] != grp.name:
                p.append(Problem(where, f"stage {s!r} is already in fused group {owner[s]!r}"))
                ok = False
            else:
                owner[s] = grp.name
        if (
            grp.streaming
            and grp.stages
            and (
                not g.has_stage(grp.stages[0]) or g.stage(grp.stages[0]).kind != StageKind.generate
            )
        ):
            p.append(
                Problem(
                    where,
                    f"streaming needs the group to start with generate, not {grp.stages[0]!r}",
                )
            )
        clean &= ok
        if not ok or has_cycle:
            continue
        members = list(grp.stages)
        # execution order must respect data dependencies
        for a_i, a in enumerate(members):
            for b in members[a_i + 1 :]:
                if nx.has_path(d, b, a):
                    p.append(
                        Problem(where, f"stage {a!r} depends on {b!r} but is listed before it")
                    )
        # contiguity: no outside stage on a path between two members
        mset = set(members)
        desc = set().union(*(nx.descendants(d, m) for m in members)) - mset
        anc = set().union(*(nx.ancestors(d, m) for m in members)) - mset
        between = sorted(desc & anc, key=lambda x: g._index[x])
        if between:
            p.append(
                Problem(
                    where,
                    f"not contiguous: {', '.join(between)} must run between members of the "
                    "group (they depend on one member and another member depends on them)",
                )
            )
    if clean and not has_cycle and g.fused and not p:
        c = nx.DiGraph()
        node = {s: owner.get(s, s) for s in (x.name for x in g.stages)}
        c.add_nodes_from(set(node.values()))
        for e in g.edges:
            if node[e.src] != node[e.dst]:
                c.add_edge(node[e.src], node[e.dst])
        if not nx.is_directed_acyclic_graph(c):
            cyc = nx.find_cycle(c)
            p.append(
                Problem(
                    "fused",
                    "fused groups depend on each other in a cycle: "
                    + " -> ".join([cyc[0][0], *(v for _, v in cyc)]),
                )
            )
    return p


# --------------------------------------------------------------------------- roles


def _colocation_problems(g: Graph) -> list[Problem]:
    p: list[Problem] = []
    seen: dict[Role, int] = {}
    for i, roles in enumerate(g.colocated):
        names = ", ".join(sorted(r.value for r in roles))
        where = f"colocated[{i}] ({names})"
        if len(roles) < 2:
            p.append(Problem(where, "a colocation set needs at least 2 roles"))
        for r in sorted(roles, key=lambda r: r.value):
            if r not in g.roles:
                used = ", ".join(sorted(x.value for x in g.roles))
                p.append(
                    Problem(
                        where, f"dangling role {r.value!r}: no stage uses it (roles used: {used})"
                    )
                )
            if r in seen:
                p.append(
                    Problem(
                        where, f"role {r.value!r} is also in colocated[{seen[r]}]; merge the sets"
                    )
                )
            else:
                seen[r] = i
    return p


def _sharing_problems(g: Graph) -> list[Problem]:
    p: list[Problem] = []
    if not isinstance(g.shared_actor_critic, bool):
        p.append(Problem("shared_actor_critic", "must be true or false"))
        return p
    if g.shared_actor_critic:
        if "values" not in g.producers:
            p.append(
                Problem(
                    "shared_actor_critic",
                    "set, but the graph has no critic (no stage writes values)",
                )
            )
        for s in g.stages:
            if s.role == Role.critic:
                p.append(
                    Problem(
                        f"stage {s.name}.role",
                        "uses role critic although actor and critic are shared (use actor)",
                    )
                )
    return p


# --------------------------------------------------------------------------- params


def _num(
    p: list[Problem],
    prm,
    key: str,
    lo: float | None = None,
    hi: float | None = None,
    allow_none: bool = False,
) -> None:
    if key not in prm:
        return
    v = prm[key]
    if v is None and allow_none:
        return
    if not isinstance(v, Real) or isinstance(v, bool):
        p.append(Problem(f"params.{key}", f"must be a number, got {v!r}"))
        return
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        p.append(Problem(f"params.{key}", f"must be in {rng}, got {v!r}"))


def _param_problems(g: Graph) -> list[Problem]:
    p: list[Problem] = []
    prm = g.params
    _num(p, prm, "kl_coef", 0)
    _num(p, prm, "clip_low", 0, 1)
    _num(p, prm, "clip_high", 0)
    _num(p, prm, "dual_clip", 1, allow_none=True)
    _num(p, prm, "gamma", 0, 1)
    _num(p, prm, "gae_lambda", 0, 1)
    _num(p, prm, "overlong_buffer", 0, allow_none=True)
    _num(p, prm, "entropy_coef", 0)
    if "dual_clip" in prm and isinstance(prm["dual_clip"], Real) and prm["dual_clip"] <= 1:
        p.append(Problem("params.dual_clip", f"must be > 1 (or null), got {prm['dual_clip']!r}"))
    if "loss_aggregation" in prm and prm["loss_aggregation"] not in LOSS_AGGREGATIONS:
        p.append(
            Problem(
                "params.loss_aggregation",
                f"{prm['loss_aggregation']!r} is not one of {', '.join(LOSS_AGGREGATIONS)}",
            )
        )
    if "kl_placement" in prm and prm["kl_placement"] not in KL_PLACEMENTS:
        p.append(
            Problem(
                "params.kl_placement",
                f"{prm['kl_placement']!r} is not one of {', '.join(KL_PLACEMENTS)}",
            )
        )
    for key in ("dynamic_sampling", "use_reference"):
        if key in prm and not isinstance(prm[key], bool):
            p.append(Problem(f"params.{key}", f"must be true or false, got {prm[key]!r}"))
    if "reward" in prm:
        if prm["reward"] not in ("rule", "model"):
            p.append(Problem("params.reward", f"{prm['reward']!r} is not one of rule, model"))
        else:
            rm = any(s.kind == StageKind.reward and s.role == Role.reward_model for s in g.stages)
            if (prm["reward"] == "model") != rm:
                p.append(
                    Problem(
                        "params.reward",
                        f"says {prm['reward']!r} but the reward stage "
                        f"{'uses' if rm else 'does not use'} role reward_model",
                    )
                )
    if isinstance(prm.get("use_reference"), bool):
        has_ref = bool(g.stages_of_kind(StageKind.ref_logprob))
        if prm["use_reference"] != has_ref:
            p.append(
                Problem(
                    "params.use_reference",
                    f"is {prm['use_reference']} but the graph "
                    f"{'has' if has_ref else 'has no'} ref_logprob stage",
                )
            )
    return p
