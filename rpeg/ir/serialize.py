"""YAML round trip of graphs: ``from_yaml(to_yaml(g)) == g``.

Loading reports every problem at once with its location (``stages[2].kind``...), then runs
:func:`rpeg.ir.checks.validate`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from rpeg import defaults
from rpeg.errors import Problem
from rpeg.ir.checks import validate
from rpeg.ir.graph import (
    DEFAULT_INPUTS,
    FIELDS,
    FusedGroup,
    Granularity,
    Graph,
    GraphError,
    Params,
    Role,
    Stage,
    StageKind,
    StateEdge,
)

_TOP_KEYS = (
    "name",
    "algorithm",
    "inputs",
    "shared_actor_critic",
    "params",
    "stages",
    "state_edges",
    "fused",
    "colocated",
)
_STAGE_KEYS = ("name", "kind", "role", "reads", "writes", "granularity")
_STATE_KEYS = ("src", "dst", "state", "staleness")
_GROUP_KEYS = ("name", "stages", "streaming")


def to_dict(g: Graph) -> dict[str, Any]:
    """Plain-data form of ``g`` (what :func:`to_yaml` writes)."""
    return {
        "name": g.name,
        "algorithm": g.algorithm,
        "inputs": list(g.inputs),
        "shared_actor_critic": g.shared_actor_critic,
        "params": dict(g.params.items()),
        "stages": [
            {
                "name": s.name,
                "kind": s.kind.value,
                "role": None if s.role is None else s.role.value,
                "reads": list(s.reads),
                "writes": list(s.writes),
                "granularity": s.granularity.value,
            }
            for s in g.stages
        ],
        "state_edges": [
            {"src": e.src, "dst": e.dst, "state": e.state, "staleness": e.staleness}
            for e in g.state_edges
        ],
        "fused": [
            {"name": f.name, "stages": list(f.stages), "streaming": f.streaming} for f in g.fused
        ],
        "colocated": [sorted(r.value for r in roles) for roles in g.colocated],
    }


def to_yaml(g: Graph) -> str:
    """YAML text of ``g``."""
    return yaml.safe_dump(to_dict(g), sort_keys=False, default_flow_style=None, width=100)


def _read_source(src: Any) -> str:
    if isinstance(src, Path):
        try:
            return src.read_text()
        except OSError as exc:
            raise GraphError([Problem(str(src), f"cannot read: {exc.strerror or exc}")]) from None
    if isinstance(src, str):
        if "\n" not in src and (src.endswith((".yaml", ".yml")) or os.path.isfile(src)):
            return _read_source(Path(src))
        return src
    raise GraphError([Problem("yaml", f"expected YAML text or a path, got {type(src).__name__}")])


def _str_list(p: list[Problem], where: str, v: Any, *, fields: bool) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        p.append(Problem(where, f"must be a list, got {type(v).__name__}"))
        return ()
    out = []
    for i, x in enumerate(v):
        if not isinstance(x, str):
            p.append(Problem(f"{where}[{i}]", f"must be a string, got {x!r}"))
        elif fields and x not in FIELDS:
            p.append(
                Problem(f"{where}[{i}]", f"unknown field {x!r} (known fields: {', '.join(FIELDS)})")
            )
        else:
            out.append(x)
    return tuple(out)


def _enum(p: list[Problem], where: str, v: Any, enum: type, *, optional: bool = False):
    if v is None and optional:
        return None
    try:
        return enum(v)
    except ValueError:
        allowed = ", ".join(e.value for e in enum) + (", null" if optional else "")
        p.append(Problem(where, f"unknown {enum.__name__} {v!r} (allowed: {allowed})"))
        return None


def _unknown_keys(p: list[Problem], where: str, d: dict, allowed: tuple[str, ...]) -> None:
    for k in d:
        if k not in allowed:
            p.append(
                Problem(
                    f"{where}.{k}" if where else str(k),
                    f"unknown key (allowed: {', '.join(allowed)})",
                )
            )


def _mapping_list(p: list[Problem], where: str, v: Any) -> list[tuple[int, dict]]:
    if v is None:
        return []
    if not isinstance(v, list):
        p.append(Problem(where, f"must be a list, got {type(v).__name__}"))
        return []
    out = []
    for i, x in enumerate(v):
        if isinstance(x, dict):
            out.append((i, x))
        else:
            p.append(Problem(f"{where}[{i}]", f"must be a mapping, got {x!r}"))
    return out


def from_dict(d: Any) -> Graph:
    """Build and validate a graph from its plain-data form."""
    p: list[Problem] = []
    if not isinstance(d, dict):
        raise GraphError([Problem("yaml", f"top level must be a mapping, got {type(d).__name__}")])
    _unknown_keys(p, "", d, _TOP_KEYS)
    for k in ("name", "stages"):
        if k not in d:
            p.append(Problem(k, "missing"))
    name = d.get("name", "")
    if "name" in d and (not isinstance(name, str) or not name):
        p.append(Problem("name", f"must be a non-empty string, got {name!r}"))
    algorithm = d.get("algorithm", name if isinstance(name, str) else "")
    if not isinstance(algorithm, str):
        p.append(Problem("algorithm", f"must be a string, got {algorithm!r}"))
    inputs = _str_list(p, "inputs", d.get("inputs", list(DEFAULT_INPUTS)), fields=True)
    shared = d.get("shared_actor_critic", False)
    if not isinstance(shared, bool):
        p.append(Problem("shared_actor_critic", f"must be true or false, got {shared!r}"))
        shared = False
    raw_params = d.get("params") or {}
    params = Params()
    if not isinstance(raw_params, dict):
        p.append(Problem("params", f"must be a mapping, got {type(raw_params).__name__}"))
    else:
        try:
            params = Params(raw_params)
        except GraphError as exc:
            p.extend(exc.problems)

    stages = []
    for i, s in _mapping_list(p, "stages", d.get("stages")):
        w = f"stages[{i}]"
        sname = s.get("name")
        if not isinstance(sname, str) or not sname:
            p.append(Problem(f"{w}.name", f"must be a non-empty string, got {sname!r}"))
        else:
            w = f"stages[{i}] ({sname})"
        _unknown_keys(p, w, s, _STAGE_KEYS)
        if "kind" not in s:
            p.append(Problem(f"{w}.kind", "missing"))
        kind = _enum(p, f"{w}.kind", s.get("kind"), StageKind) if "kind" in s else None
        role = _enum(p, f"{w}.role", s.get("role"), Role, optional=True)
        gran = _enum(p, f"{w}.granularity", s.get("granularity", "batch"), Granularity)
        reads = _str_list(p, f"{w}.reads", s.get("reads"), fields=True)
        writes = _str_list(p, f"{w}.writes", s.get("writes"), fields=True)
        if isinstance(sname, str) and kind is not None and gran is not None:
            stages.append(Stage(sname, kind, role, reads, writes, gran))

    state_edges = []
    for i, e in _mapping_list(p, "state_edges", d.get("state_edges")):
        w = f"state_edges[{i}]"
        _unknown_keys(p, w, e, _STATE_KEYS)
        ok = True
        for k in ("src", "dst"):
            if not isinstance(e.get(k), str):
                p.append(Problem(f"{w}.{k}", f"must be a stage name, got {e.get(k)!r}"))
                ok = False
        state = e.get("state", "weights")
        if not isinstance(state, str):
            p.append(Problem(f"{w}.state", f"must be a string, got {state!r}"))
            ok = False
        k_ = e.get("staleness", defaults.MAX_STALENESS)
        if not isinstance(k_, int) or isinstance(k_, bool):
            p.append(Problem(f"{w}.staleness", f"must be an integer, got {k_!r}"))
            ok = False
        if ok:
            state_edges.append(StateEdge(e["src"], e["dst"], state, k_))

    fused = []
    for i, f in _mapping_list(p, "fused", d.get("fused")):
        w = f"fused[{i}]"
        _unknown_keys(p, w, f, _GROUP_KEYS)
        fname = f.get("name")
        if not isinstance(fname, str) or not fname:
            p.append(Problem(f"{w}.name", f"must be a non-empty string, got {fname!r}"))
        members = _str_list(p, f"{w}.stages", f.get("stages"), fields=False)
        streaming = f.get("streaming", False)
        if not isinstance(streaming, bool):
            p.append(Problem(f"{w}.streaming", f"must be true or false, got {streaming!r}"))
        elif isinstance(fname, str):
            fused.append(FusedGroup(fname, members, streaming))

    colocated = []
    raw_col = d.get("colocated") or []
    if not isinstance(raw_col, list):
        p.append(
            Problem("colocated", f"must be a list of role lists, got {type(raw_col).__name__}")
        )
        raw_col = []
    for i, roles in enumerate(raw_col):
        if not isinstance(roles, list):
            p.append(Problem(f"colocated[{i}]", f"must be a list of roles, got {roles!r}"))
            continue
        rs = [_enum(p, f"colocated[{i}][{j}]", r, Role) for j, r in enumerate(roles)]
        if all(r is not None for r in rs):
            colocated.append(frozenset(rs))

    if p:
        raise GraphError(p)
    g = Graph(
        name=name,
        algorithm=algorithm,
        stages=tuple(stages),
        state_edges=tuple(state_edges),
        fused=tuple(fused),
        colocated=tuple(colocated),
        shared_actor_critic=shared,
        params=params,
        inputs=inputs,
    )
    return validate(g)


def from_yaml(text_or_path: Any) -> Graph:
    """Load and validate a graph from YAML text, a path string or a :class:`Path`."""
    text = _read_source(text_or_path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"yaml line {mark.line + 1}, column {mark.column + 1}" if mark else "yaml"
        what = getattr(exc, "problem", None) or str(exc)
        raise GraphError([Problem(where, f"malformed YAML: {what}")]) from None
    return from_dict(data)
