"""``rpeg plan``: search the best execution plan for a run, report it, write it as YAML."""

from __future__ import annotations

from pathlib import Path

import typer

from rpeg.cli import json_out


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def _sizes(text: str) -> list[int]:
    from rpeg.errors import ConfigError, Problem

    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(
            [Problem("--sweep", f"expected comma-separated GPU counts, got {text!r}")]
        ) from None
    if not out or any(x < 1 for x in out):
        raise ConfigError([Problem("--sweep", "GPU counts must be positive integers")])
    return sorted(set(out))


def plan(
    config: Path | None = typer.Argument(None, help="run config YAML (flags below override it)"),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="write the plan YAML here (+ graph, Gantt)"
    ),
    as_json: bool = typer.Option(
        False, "--json", help="print a JSON summary instead of the report"
    ),
    sweep: str | None = typer.Option(None, "--sweep", help="GPU counts, e.g. 16,32,64,128,256"),
    model: str | None = typer.Option(None, "--model", help="catalog model, e.g. qwen2.5-32b"),
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU type, e.g. gh200 (picks its catalog cluster)"
    ),
    cluster: str | None = typer.Option(None, "--cluster", help="catalog cluster name"),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="number of GPUs to plan for"),
    algo: str | None = typer.Option(None, "--algo", help="grpo, ppo, rloo, reinforce_pp"),
    num_prompts: int | None = typer.Option(None, "--num-prompts", min=1),
    samples_per_prompt: int | None = typer.Option(None, "--samples-per-prompt", min=1),
    max_response_tokens: int | None = typer.Option(None, "--max-response-tokens", min=1),
    mean_response_tokens: float | None = typer.Option(None, "--mean-response-tokens", min=1),
    max_staleness: int | None = typer.Option(None, "--max-staleness", min=0),
    seed: int | None = typer.Option(None, "--seed"),
    mode: str | None = typer.Option(None, "--mode", help="auto, exhaustive, decompose"),
    max_candidates: int | None = typer.Option(None, "--max-candidates", min=0),
    time_budget_s: float | None = typer.Option(None, "--time-budget-s", min=0),
) -> None:
    """Find the fastest feasible plan (structure, placement, layouts) and compare it with
    verl-, ReaL- and AReaL-style baselines priced by the same performance model."""
    from rpeg.errors import ConfigError, Problem
    from rpeg.search.inputs import config_from_kwargs, load_config
    from rpeg.search.optimizer import SearchOptions, optimize_problem
    from rpeg.search.problem import problem_from_config

    if mode is not None and mode not in ("auto", "exhaustive", "decompose"):
        raise ConfigError(
            [Problem("--mode", f"got {mode!r}; allowed: auto, exhaustive, decompose")]
        )
    flags = dict(
        model=model,
        gpu=gpu,
        cluster=cluster,
        gpus=gpus,
        algo=algo,
        num_prompts=num_prompts,
        samples_per_prompt=samples_per_prompt,
        max_response_tokens=max_response_tokens,
        mean_response_tokens=mean_response_tokens,
        max_staleness=max_staleness,
    )
    base = load_config(config) if config is not None else None
    cfg = config_from_kwargs(flags, base=base)
    s = cfg.search
    opt = SearchOptions(
        mode=mode or s.mode,
        seed=s.seed if seed is None else seed,
        max_candidates=s.max_candidates if max_candidates is None else max_candidates,
        time_budget_s=s.time_budget_s if time_budget_s is None else time_budget_s,
        top_alternatives=s.top_alternatives,
    )
    if sweep:
        _sweep(cfg, _sizes(sweep), opt, out, as_json)
        return
    result = optimize_problem(problem_from_config(cfg), options=opt)
    files = {}
    if out is not None:
        from rpeg.search.report import write_files

        files = write_files(result, out, config=cfg)
    if as_json:
        d = result.to_dict()
        d["files"] = files
        typer.echo(json_out.dumps(d, indent=1, default=str))
        return
    from rpeg.search.report import render

    render(result, files=files)


def _sweep(cfg, sizes: list[int], opt, out: Path | None, as_json: bool) -> None:
    from rpeg.search.optimizer import optimize_problem
    from rpeg.search.problem import problem_from_config
    from rpeg.search.report import sweep_plot

    rows = []
    for n in sizes:
        c = cfg.model_copy(deep=True)
        c.cluster.num_devices = n
        try:
            r = optimize_problem(problem_from_config(c), options=opt)
        except Exception as exc:  # an infeasible size is a row, not the end of the sweep
            from rpeg.plan import InfeasiblePlan

            if not isinstance(exc, InfeasiblePlan):
                raise
            rows.append({"gpus": n, "rpeg": None, "reason": str(exc)})
            continue
        row = {"gpus": n, "rpeg": r.best.step_s, "plan": r.best.describe(), "search_s": r.search_s}
        for k in ("verl", "real", "areal"):
            b = r.baselines[k]
            row[k] = b.candidate.step_s if b.candidate else None
        row["gpu_hours_per_1000_steps"] = r.best.step_s * n * 1000 / 3600
        rows.append(row)
    stem = out.with_suffix("") if out else Path("plan")
    path = sweep_plot(
        rows, f"{stem}.sweep.png", title=f"{cfg.model.name} {cfg.algorithm.name} (predicted)"
    )
    if as_json:
        typer.echo(json_out.dumps({"sweep": rows, "figure": path}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="sweep (predicted)")
    for col in ("GPUs", "RPEG step s", "GPU-h / 1k steps", "verl", "ReaL", "AReaL", "plan"):
        t.add_column(col)
    for r in rows:
        f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        t.add_row(
            str(r["gpus"]),
            f(r["rpeg"]),
            f(r.get("gpu_hours_per_1000_steps")),
            f(r.get("verl")),
            f(r.get("real")),
            f(r.get("areal")),
            r.get("plan", r.get("reason", "")),
        )
    Console().print(t)
    Console().print(f"figure: {path}")
