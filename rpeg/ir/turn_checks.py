"""The checks of multi-turn graphs (pure): an ``env`` stage runs between the turns of one
generate stage, inside that stage's execution unit (docs/ir.md "Multi-turn: the env stage")."""

from __future__ import annotations

from rpeg.errors import Problem
from rpeg.ir.graph import Graph, StageKind


def turn_problems(g: Graph) -> list[Problem]:
    """Each env stage takes the model's turns from a generate stage and feeds it the next
    turn's observations: both in one fused group, so one unit runs the loop."""
    p: list[Problem] = []
    for s in g.env_stages:
        where = f"stage {s.name}"
        gens = sorted(
            {e.src for e in g.edges if e.dst == s.name}
            | {e.dst for e in g.edges if e.src == s.name and e.next_turn}
        )
        gens = [n for n in gens if g.stage(n).kind == StageKind.generate]
        if not gens:
            p.append(
                Problem(where, "an env stage must read what a generate stage writes (actions)")
            )
            continue
        grp = g.group_of(s.name)
        apart = [n for n in gens if grp is None or n not in grp.stages]
        if apart:
            p.append(
                Problem(
                    where,
                    f"an env stage runs between the turns of {', '.join(apart)}: fuse them in one "
                    f"group (e.g. fuse(g, [{apart[0]!r}, {s.name!r}]))",
                )
            )
    for e in g.edges:
        if g.stage(e.src).kind == StageKind.env and not e.next_turn:
            p.append(
                Problem(
                    f"stage {e.dst}.reads",
                    f"{e.field!r} is an env stage's per-turn output: only generate reads it",
                )
            )
    return p
