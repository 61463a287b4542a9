"""Pictures of graphs: Graphviz DOT, Mermaid, and PNG/SVG when the ``dot`` binary exists."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from rpeg.errors import Problem
from rpeg.ir.graph import WEIGHTS_STATE, FusedGroup, Granularity, Graph, GraphError, Role, Stage

ROLE_COLORS: dict[Role | None, str] = {
    Role.actor: "#8ecae6",
    Role.reference: "#d9d9d9",
    Role.critic: "#ffb703",
    Role.reward_model: "#b5e48c",
    None: "#ffffff",
}


def _q(s: str) -> str:
    esc = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + esc + '"'


def _role(r: Role | None) -> str:
    return "no model" if r is None else r.value


def _grouped_edges(g: Graph) -> list[tuple[str, str, list[str], Granularity]]:
    """Data edges grouped per (src, dst); without the next-turn edges (:func:`_turn_edges`)."""
    out: dict[tuple[str, str], tuple[list[str], Granularity]] = {}
    for e in g.edges:
        if e.next_turn:
            continue
        fields, gran = out.setdefault((e.src, e.dst), ([], e.granularity))
        fields.append(e.field)
    return [(s, d, f, gr) for (s, d), (f, gr) in out.items()]


def _turn_edges(g: Graph) -> list[tuple[str, str, list[str]]]:
    """(env stage, generate stage, fields) of the loops of multi-turn rollouts."""
    out: dict[tuple[str, str], list[str]] = {}
    for e in g.edges:
        if e.next_turn:
            out.setdefault((e.src, e.dst), []).append(e.field)
    return [(s, d, f) for (s, d), f in out.items()]


def _node_groups(g: Graph) -> tuple[list[tuple[FusedGroup, list[Stage]]], list[Stage]]:
    """(each fused group with its stages, the stages in no group), in graph order."""
    groups = [(grp, [g.stage(n) for n in grp.stages if g.has_stage(n)]) for grp in g.fused]
    grouped = {s.name for _, members in groups for s in members}
    return groups, [s for s in g.stages if s.name not in grouped]


def _input_reads(g: Graph) -> list[tuple[Stage, list[str]]]:
    """(stage, the step inputs it reads) for every stage reading some."""
    reads = [(s, [f for f in s.reads if f in g.inputs]) for s in g.stages]
    return [(s, fs) for s, fs in reads if fs]


def to_dot(g: Graph) -> str:
    """Graphviz DOT: fused groups as clusters, roles as colours, state edges dashed with k."""
    lines = [
        f"digraph {_q(g.name)} {{",
        "  rankdir=LR;",
        f'  graph [fontname="Helvetica", fontsize=11, labelloc=t, label={_q(_title(g))}];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=8];',
        '  inputs [shape=note, fillcolor="#f8f9fa", label='
        + _q("inputs\n" + ", ".join(g.inputs))
        + "];",
    ]

    def node(s, indent="  "):
        label = f"{s.name}\n[{s.kind.value}]\n{_role(s.role)}"
        if s.granularity != Granularity.batch:
            label += f" / {s.granularity.value}"
        return f"{indent}{_q(s.name)} [label={_q(label)}, fillcolor={_q(ROLE_COLORS[s.role])}];"

    groups, loose = _node_groups(g)
    for i, (grp, members) in enumerate(groups):
        lines.append(f"  subgraph cluster_{i} {{")
        tag = " (streaming)" if grp.streaming else ""
        lines.append(
            f'    label={_q("fused: " + grp.name + tag)}; style="dashed,rounded"; color="#555555";'
        )
        lines.extend(node(s, "    ") for s in members)
        lines.append("  }")
    lines.extend(node(s) for s in loose)
    for s, fs in _input_reads(g):
        lines.append(f'  inputs -> {_q(s.name)} [label={_q(", ".join(fs))}, color="#999999"];')
    for src, dst, fields, gran in _grouped_edges(g):
        attrs = [f"label={_q(', '.join(fields))}"]
        if gran == Granularity.sample:
            attrs.append("penwidth=2.5")
            attrs[0] = f"label={_q(', '.join(fields) + ' (per sample)')}"
        lines.append(f"  {_q(src)} -> {_q(dst)} [{', '.join(attrs)}];")
    for src, dst, fields in _turn_edges(g):
        label = _q(", ".join(fields) + " (next turn)")
        lines.append(
            f"  {_q(src)} -> {_q(dst)} [style=dashed, constraint=false, penwidth=2.5, label={label}];"
        )
    for e in g.state_edges:
        color = "#d62828" if e.state == WEIGHTS_STATE else "#6c757d"
        lines.append(
            f"  {_q(e.src)} -> {_q(e.dst)} [style=dashed, constraint=false, color={_q(color)}, "
            f"fontcolor={_q(color)}, label={_q(f'{e.state} k={e.staleness} (next step)')}];"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _title(g: Graph) -> str:
    bits = [f"{g.name} ({g.algorithm})", f"staleness k={g.staleness}"]
    if g.shared_actor_critic:
        bits.append("shared actor-critic")
    for roles in g.colocated:
        bits.append("colocated: " + "+".join(sorted(r.value for r in roles)))
    return ", ".join(bits)


def _mid(name: str) -> str:
    return "s_" + "".join(c if c.isalnum() else "_" for c in name)


def to_mermaid(g: Graph) -> str:
    """Mermaid flowchart text (renders on GitHub and in most Markdown viewers)."""
    lines = ["flowchart LR", f"  %% {_title(g)}"]
    for r, color in ROLE_COLORS.items():
        lines.append(f"  classDef {_role(r).replace(' ', '_')} fill:{color},stroke:#333")
    lines.append(f'  inputs[/"inputs: {", ".join(g.inputs)}"/]')

    def node(s, indent="  "):
        label = f"{s.name}<br/>[{s.kind.value}]<br/>{_role(s.role)}"
        return f'{indent}{_mid(s.name)}["{label}"]:::{_role(s.role).replace(" ", "_")}'

    groups, loose = _node_groups(g)
    for i, (grp, members) in enumerate(groups):
        tag = " (streaming)" if grp.streaming else ""
        lines.append(f'  subgraph g{i}["fused: {grp.name}{tag}"]')
        lines.extend(node(s, "    ") for s in members)
        lines.append("  end")
    lines.extend(node(s) for s in loose)
    for s, fs in _input_reads(g):
        lines.append(f"  inputs -->|{', '.join(fs)}| {_mid(s.name)}")
    for src, dst, fields, gran in _grouped_edges(g):
        arrow = "==>" if gran == Granularity.sample else "-->"
        lines.append(f"  {_mid(src)} {arrow}|{', '.join(fields)}| {_mid(dst)}")
    for src, dst, fields in _turn_edges(g):
        lines.append(f"  {_mid(src)} -.->|{', '.join(fields)} next turn| {_mid(dst)}")
    for e in g.state_edges:
        lines.append(f"  {_mid(e.src)} -.->|{e.state} k={e.staleness}| {_mid(e.dst)}")
    return "\n".join(lines) + "\n"


def has_graphviz() -> bool:
    """Whether the Graphviz ``dot`` binary is on PATH."""
    return shutil.which("dot") is not None


def dot_to_image(dot_text: str, path: Path, fmt: str) -> Path:
    """Run ``dot -T<fmt>`` to write ``path``."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphError([Problem("render", "the Graphviz 'dot' binary is not installed")])
    res = subprocess.run(
        [exe, f"-T{fmt}", "-o", str(path)],
        input=dot_text,
        text=True,
        capture_output=True,
        timeout=60,
    )
    if res.returncode != 0:
        raise GraphError([Problem("render", f"dot failed: {res.stderr.strip()}")])
    return path


def render(g: Graph, path: str | Path, *, images: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """Write ``<path>.dot`` and ``<path>.mmd`` always, and ``.png``/``.svg`` when ``dot`` exists.

    ``path`` may carry a suffix (it is stripped). Returns the written paths.
    """
    p = Path(path)
    if p.suffix in (".dot", ".mmd", ".png", ".svg", ".gv"):
        p = p.with_suffix("")
    p.parent.mkdir(parents=True, exist_ok=True)
    dot = to_dot(g)
    written = []
    for suffix, text in ((".dot", dot), (".mmd", to_mermaid(g))):
        q = p.with_name(p.name + suffix)
        q.write_text(text)
        written.append(q)
    if has_graphviz():
        for fmt in images:
            written.append(dot_to_image(dot, p.with_name(p.name + "." + fmt), fmt))
    return written
