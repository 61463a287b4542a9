"""``rpeg graph show|validate|render``: inspect, check and draw RPEG graphs."""

from __future__ import annotations

from pathlib import Path

import typer

graph_app = typer.Typer(
    name="graph",
    help="Inspect, validate and render RL pipeline graphs (builders or YAML files).",
    no_args_is_help=True,
)

_SOURCE_HELP = (
    "a builder name (grpo, ppo, rloo, reinforce_pp, dapo), a graph YAML file, or a run config "
    "YAML (its algorithm's graph, with the env stage when task.multiturn.env is set)"
)

#: top-level keys of a run config (rpeg.config.RunConfig), none of which a graph YAML has
_RUN_CONFIG_KEYS = ("model", "algorithm", "task", "workload", "runtime", "cluster", "optim")


def _graph_from_file(path: Path):
    """A graph YAML file, or the graph of a run config YAML (rpeg.compile.graph_from_config)."""
    import yaml

    from rpeg import ir

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        data = None  # from_yaml reports the line and column
    if isinstance(data, dict) and "stages" not in data and set(data) & set(_RUN_CONFIG_KEYS):
        from rpeg.compile import graph_from_config
        from rpeg.config import RunConfig

        return graph_from_config(RunConfig.from_yaml(str(path)))
    return ir.from_yaml(path)


def _parse_option(text: str):
    import yaml

    from rpeg.errors import Problem
    from rpeg.ir import GraphError

    if "=" not in text:
        raise GraphError([Problem(f"--option {text}", "expected KEY=VALUE")])
    key, value = text.split("=", 1)
    return key.strip(), yaml.safe_load(value) if value.strip() else None


def load_graph(
    source: str,
    staleness: int | None = None,
    share: bool = False,
    fuse: list[str] | None = None,
    streaming: bool = False,
    colocate: list[str] | None = None,
    options: list[str] | None = None,
):
    """Build or load ``source`` then apply the requested transforms (share, fuse, colocate,
    staleness, in that order). The arguments are the commands' options, in their order."""
    from rpeg import ir
    from rpeg.errors import Problem

    key = source.lower()
    if key in ir.BUILDERS or key in ir.builders.ALIASES:
        g = ir.build(key, **dict(_parse_option(o) for o in options or []))
    elif Path(source).is_file():
        if options:
            raise ir.GraphError(
                [Problem("--option", "builder options apply only to builder names")]
            )
        g = _graph_from_file(Path(source))
    else:
        raise ir.GraphError(
            [
                Problem(
                    source,
                    f"not a builder name ({', '.join(ir.builder_names())}) nor an existing YAML file",
                )
            ]
        )
    if share:
        g = ir.share_actor_critic(g)
    for i, group in enumerate(fuse or []):
        g = ir.fuse(g, group, streaming=streaming and i == 0)
    if streaming and not fuse:
        raise ir.GraphError(
            [Problem("--streaming", "needs --fuse (a group starting with generate)")]
        )
    if colocate:
        for roles in colocate:
            g = ir.colocate(g, roles)
    if staleness is not None:
        g = ir.bound_async(g, staleness)
    return g


_staleness = typer.Option(None, "--staleness", "-k", help="bounded asynchrony k (0 = on-policy)")
_share = typer.Option(False, "--share", help="share actor and critic (PPO)")
_fuse = typer.Option(None, "--fuse", help="comma-separated stages to fuse (repeatable)")
_streaming = typer.Option(False, "--streaming", help="the first --fuse group streams samples")
_colocate = typer.Option(None, "--colocate", help="comma-separated roles to colocate (repeatable)")
_options = typer.Option(None, "--option", "-o", help="builder option KEY=VALUE (repeatable)")


def _show(g) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))
    t = Table(
        title=f"{g.name} ({g.algorithm}): staleness k={g.staleness}"
        + (", shared actor-critic" if g.shared_actor_critic else "")
    )
    for col in ("stage", "kind", "role", "reads", "writes", "granularity", "group"):
        if col in ("reads", "writes"):
            t.add_column(col, overflow="fold", ratio=1)
        else:
            t.add_column(col, no_wrap=True)
    order = {n: i for i, n in enumerate(g.topological_order())}
    for s in sorted(g.stages, key=lambda s: order[s.name]):
        grp = g.group_of(s.name)
        t.add_row(
            s.name,
            s.kind.value,
            s.role.value if s.role else "-",
            ", ".join(s.reads),
            ", ".join(s.writes) or "-",
            s.granularity.value,
            (grp.name + (" (streaming)" if grp.streaming else "")) if grp else "-",
        )
    console.print(t)
    st = Table(title="state edges (cross-step)")
    for col in ("src", "dst", "state", "staleness k"):
        st.add_column(col)
    for e in g.state_edges:
        st.add_row(e.src, e.dst, e.state, str(e.staleness))
    console.print(st)
    for e in g.edges:
        if e.next_turn:  # multi-turn: the loop inside the rollout unit
            console.print(f"turn loop: {e.src} -> {e.dst} ({e.field}, the next turn)")
    console.print(f"inputs: {', '.join(g.inputs)}")
    if g.colocated:
        console.print(
            "colocated: " + "; ".join("+".join(sorted(r.value for r in c)) for c in g.colocated)
        )
    console.print("params: " + ", ".join(f"{k}={v}" for k, v in g.params.items()))


@graph_app.command("show")
def show(
    source: str = typer.Argument(..., help=_SOURCE_HELP),
    staleness: int | None = _staleness,
    share: bool = _share,
    fuse: list[str] | None = _fuse,
    streaming: bool = _streaming,
    colocate: list[str] | None = _colocate,
    option: list[str] | None = _options,
) -> None:
    """Print the stages (name, kind, role, reads, writes, group) and the state edges."""
    g = load_graph(source, staleness, share, fuse, streaming, colocate, option)
    _show(g)


@graph_app.command("validate")
def validate(
    source: str = typer.Argument(..., help=_SOURCE_HELP),
    staleness: int | None = _staleness,
    share: bool = _share,
    fuse: list[str] | None = _fuse,
    streaming: bool = _streaming,
    colocate: list[str] | None = _colocate,
    option: list[str] | None = _options,
) -> None:
    """Print "ok", or every problem of the graph (exit code 2)."""
    from rpeg.ir import checks

    g = load_graph(source, staleness, share, fuse, streaming, colocate, option)
    checks.validate(g)
    typer.echo("ok")


_FORMATS = ("dot", "mermaid", "png", "svg", "yaml")


@graph_app.command("render")
def render(
    source: str = typer.Argument(..., help=_SOURCE_HELP),
    staleness: int | None = _staleness,
    share: bool = _share,
    fuse: list[str] | None = _fuse,
    streaming: bool = _streaming,
    colocate: list[str] | None = _colocate,
    option: list[str] | None = _options,
    out: Path | None = typer.Option(None, "--out", help="output file (stdout for text formats)"),
    fmt: str | None = typer.Option(
        None,
        "--format",
        "-f",
        help="dot | mermaid | png | svg | yaml (default: from --out, else dot)",
    ),
) -> None:
    """Write the graph as DOT, Mermaid, YAML, or a PNG/SVG picture (needs Graphviz `dot`)."""
    from rpeg import ir
    from rpeg.errors import Problem

    if fmt is None:
        suffix = out.suffix.lower().lstrip(".") if out else ""
        fmt = {"mmd": "mermaid", "yml": "yaml", "gv": "dot"}.get(suffix, suffix) or "dot"
    fmt = fmt.lower()
    if fmt not in _FORMATS:
        raise ir.GraphError([Problem("--format", f"{fmt!r} is not one of {', '.join(_FORMATS)}")])
    g = load_graph(source, staleness, share, fuse, streaming, colocate, option)
    if fmt in ("png", "svg"):
        target = out or Path(f"{g.name}.{fmt}")
        from rpeg.ir import visual

        if not visual.has_graphviz():  # refused: no picture, and no other files instead
            stem = target.with_suffix("")
            raise ir.GraphError(
                [
                    Problem(
                        "--out" if out is not None else "--format",
                        f"a {fmt.upper()} picture needs Graphviz's `dot` program, which is not "
                        "on PATH: install graphviz (apt install graphviz, brew install "
                        "graphviz, conda install graphviz), or write text instead: "
                        f"--out {stem}.dot (DOT) or --out {stem}.mmd (Mermaid)",
                    )
                ],
                title="cannot draw the picture",
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        visual.dot_to_image(ir.to_dot(g), target, fmt)
        typer.echo(str(target))
        return
    text = {"dot": ir.to_dot, "mermaid": ir.to_mermaid, "yaml": ir.to_yaml}[fmt](g)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        typer.echo(str(out))


def register(app: typer.Typer) -> None:
    app.add_typer(graph_app, name="graph")
