"""Explaining a search result: words, tables (rich), and the files next to the plan (pure;
matplotlib and Graphviz are only touched when writing pictures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rpeg.search.result import Candidate, SearchResult, why_lost


def plan_in_words(c: Candidate, cluster: Any) -> list[str]:
    """One line per decision, in plain words."""
    st, pl, plan = c.structure, c.placement, c.plan
    gpn = cluster.gpus_per_node

    def nodes(n: int) -> int:  # a CPU machine's workers beyond its cores stay on its nodes
        return min(cluster.num_nodes, n // gpn) or 1

    lines = []
    if pl.colocated:
        lines.append(
            f"All stages time-share the same {pl.num_devices} devices ({nodes(pl.num_devices)} nodes)"
            + (
                ", offloading idle model state to host memory"
                if pl.offload
                else ", all state resident"
            )
            + "."
        )
    else:
        lines.append(
            f"Generation runs on devices 0-{pl.gen_devices - 1} ({nodes(pl.gen_devices)} nodes), "
            f"training and the log-prob passes on {pl.gen_devices}-{pl.num_devices - 1} "
            f"({nodes(pl.train_devices)} nodes)"
            + (", offloading idle state there" if pl.offload else "")
            + "."
        )
    if st.staleness == 0:
        lines.append(
            "Synchronous (on-policy, k=0)"
            + ("; the trainer streams mini-batches behind generation" if pl.streaming else "")
            + "."
        )
    else:
        lines.append(
            f"Asynchronous with staleness bound k={st.staleness}: generation overlaps training"
            + (", with partial rollouts surviving weight updates" if pl.partial_rollout else "")
            + "."
        )
    if st.share_actor_critic:
        lines.append("Actor and critic share one trunk (value head): one forward, one update.")
    if st.fusion != "none":
        what = {
            "rollout": "generate+reward (streaming)",
            "forward": "the forward log-prob passes",
            "rollout+forward": "generate+reward (streaming) and the forward log-prob passes",
        }[st.fusion]
        lines.append(f"Fused into one process each: {what}.")
    for name, u in plan.units.items():
        lay = c.layouts[name]
        stage = c.prediction.stages.get(name)
        if stage is None or stage.time_s <= 0 and name in ("reward", "advantage"):
            continue
        if lay == type(lay)():
            continue
        lines.append(
            f"{name}: tp={u.tp} pp={u.pp}"
            + (f" cp={u.cp}" if u.cp > 1 else "")
            + (f" ep={u.ep}" if u.ep > 1 else "")
            + f" dp={u.dp_size}"
            + (
                ""
                if "generate" in stage.kinds
                else f", micro-batch {u.micro_batch_size}, {'recompute' if u.recompute else 'no recompute'}, engine {u.engine}"
            )
        )
    return lines


def render(result: SearchResult, console: Any = None, files: dict[str, str] | None = None) -> None:
    """Print the report with rich."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    b = result.best
    p = b.prediction
    prob = result.problem
    con.print(f"[bold]RPEG plan[/bold] for {prob.describe()}")
    for line in plan_in_words(b, prob.cluster):
        con.print(f"  - {line}")
    t = Table(title="execution units (predicted)")
    for col in ("unit", "devices", "tp", "pp", "cp", "dp", "mb", "time s", "ends s", "mem GB/dev"):
        t.add_column(col, justify="right" if col not in ("unit", "devices") else "left")
    span = {r.stage: f"{r.end_s:.2f}" for r in p.timeline}  # where it ends on the Gantt
    for name, u in b.plan.units.items():
        s = p.stages[name]
        t.add_row(
            name,
            s.devices,
            str(u.tp),
            str(u.pp),
            str(u.cp),
            str(u.dp_size),
            str(u.micro_batch_size),
            f"{s.time_s:.2f}",
            span.get(name, ""),
            f"{s.peak_memory_gb:.1f}",
        )
    for r in fixed_records(p):  # fixed costs: named rows, so the table adds up to the step
        t.add_row(
            r.stage, r.device_group, "", "", "", "", "", f"{r.duration_s:.2f}", span[r.stage], ""
        )
    con.print(t)
    rng = ""
    if result.step_range is not None:
        lo, hi = result.step_range
        rng = f" (range {lo:.1f}-{hi:.1f} s)"
    con.print(
        f"predicted step [bold]{p.step_s:.1f} s[/bold]{rng} = end of the Gantt, "
        f"{p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {100 * p.mfu:.1f}%"
    )
    for line in memory_words(p):
        con.print(f"  memory {line}")
    bt = Table(title="baselines (same performance model)")
    for col in ("baseline", "plan", "step s", "RPEG speedup"):
        bt.add_column(col)
    for name, bl in result.baselines.items():
        if bl.candidate is None:
            bt.add_row(name, bl.description, "-", f"n/a ({bl.reason})")
        else:
            bt.add_row(
                name,
                bl.candidate.describe(),
                f"{bl.candidate.step_s:.1f}",
                f"{bl.candidate.step_s / b.step_s:.2f}x",
            )
    con.print(bt)
    if result.alternatives:
        at = Table(title="top alternatives")
        for col in ("alternative", "step s", "why it lost"):
            at.add_column(col)
        for a in result.alternatives:
            at.add_row(a.describe(), f"{a.step_s:.1f}", why_lost(a, b))
        con.print(at)
    if result.dimensions:
        dt = Table(title="best plan training at pp > 1 / cp > 1 (same structure and placement)")
        for col in ("dim", "training layout", "step s", "vs chosen", "why"):
            dt.add_column(col)
        for dim, alt in result.dimensions.items():
            for row in dimension_rows(dim, alt, b):
                dt.add_row(*row)
        con.print(dt)
    cd = result.counts.to_dict()
    con.print(
        f"search: {result.mode}, {result.search_s:.1f} s, {cd['structures']} structures, "
        f"{cd['placements']} cells ({cd['pruned_by_bound']} pruned by bound), {cd['evaluated']} plans priced; "
        "rejected: " + (", ".join(f"{k} {v}" for k, v in cd["infeasible"].items()) or "none")
    )
    for a in p.assumptions:
        con.print(f"assumption: {a}")
    for what, path in (files or {}).items():
        con.print(f"{what}: {path}")
    con.print(
        "[dim]All numbers are predictions of the analytical performance model, not measurements.[/dim]"
    )


def dimension_rows(dim: str, alt: Any, best: Candidate) -> list[tuple[str, ...]]:
    """Table rows of one :class:`rpeg.search.result.DimensionAlternative`."""
    if alt.chosen:
        return [(dim, alt.describe(), f"{best.step_s:.1f}", "1.00x", "the chosen plan")]
    if alt.candidate is None:
        why = (
            alt.reason if alt.reason.startswith("not searched") else f"none feasible: {alt.reason}"
        )
        return [(dim, "-", "-", "-", why)]
    c = alt.candidate
    return [
        (
            dim,
            alt.describe(),
            f"{c.step_s:.1f}",
            f"{c.step_s / best.step_s:.2f}x",
            why_lost(c, best),
        )
    ]


def fixed_records(p: Any) -> list[Any]:
    """Timeline records of the fixed per-step costs (offload/reload, step overhead)."""
    return [r for r in p.timeline if r.kind in ("offload", "step_overhead")]


def memory_words(p: Any) -> list[str]:
    """Per device group: the peak per device and what holds it (the largest unit's parts;
    a rollout engine reserves gpu_memory_utilization x HBM whatever the model's size)."""
    out = []
    for group, gb in p.device_memory_gb.items():
        top = max(
            (s for s in p.stages.values() if s.devices == group or group.startswith(s.devices)),
            key=lambda s: s.peak_memory_gb,
            default=None,
        )
        what = ""
        if top is not None and top.memory_gb:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in top.memory_gb.items() if v >= 0.05)
            what = f" (largest: {top.name}: {parts} GB"
            if "kv_cache" in top.memory_gb:
                what += "; the engine reserves gpu_memory_utilization x device memory up front"
            what += ")"
        out.append(f"{group}: {gb:.1f}/{p.capacity_gb:.0f} GB per device{what}")
    return out


def write_files(result: SearchResult, out: str | Path, *, config: Any = None) -> dict[str, str]:
    """plan YAML at ``out``; next to it the run config, the graph picture and the Gantt."""
    from rpeg.ir import render as render_graph
    from rpeg.perf.timeline import gantt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.plan.to_yaml())
    files = {"plan": str(out)}
    stem = out.with_suffix("")
    if config is not None:
        cfg_path = Path(f"{stem}.config.yaml")
        cfg = config.model_copy(deep=True)
        cfg.plan = str(out.resolve())  # `rpeg train <stem>.config.yaml` runs this plan
        cfg_path.write_text(cfg.to_yaml())
        files["config"] = str(cfg_path)
    g = result.best.structure.graph(result.problem.base)
    written = render_graph(g, f"{stem}.graph")
    files["graph"] = (
        ", ".join(str(x) for x in written)
        if isinstance(written, (list, tuple))
        else f"{stem}.graph.dot"
    )
    gpath = f"{stem}.gantt.png"
    b = result.best
    gantt(b.prediction.timeline, gpath, title=f"{b.plan.model}: {b.step_s:.1f} s/step (predicted)")
    files["gantt"] = gpath
    return files


def sweep_plot(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> str:
    """Step time and cost (GPU-hours per 1,000 steps) vs GPU count, RPEG and baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["rpeg"] + [k for k in ("verl", "real", "areal") if any(r.get(k) for r in rows)]
    for name in names:
        xs = [r["gpus"] for r in rows if r.get(name)]
        ys = [r[name] for r in rows if r.get(name)]
        if not xs:
            continue
        a1.plot(xs, ys, marker="o", label=name)
        a2.plot(
            xs, [y * x * 1000 / 3600 for x, y in zip(xs, ys, strict=True)], marker="o", label=name
        )
    for ax, lab in ((a1, "predicted step time (s)"), (a2, "GPU-hours per 1,000 steps")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
