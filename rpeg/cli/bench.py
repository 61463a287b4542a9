"""``rpeg bench PLAN [--baselines]``: predicted vs measured step time and speedup of the
chosen plan and the planner's baselines, each run for a few steps through the real runtime
(rpeg.flows.bench)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def _config_for(path: Path):
    """The run config a PLAN argument stands for: PLAN.config.yaml beside a plan written
    by ``rpeg plan --out PLAN.yaml``, or PLAN itself when it is a run config."""
    from rpeg.errors import ConfigError, Problem
    from rpeg.preflight import load_config

    if not path.is_file():
        raise ConfigError([Problem(str(path), "file not found (a plan YAML or a run config)")])
    sibling = path.with_name(path.stem + ".config.yaml")
    if sibling.is_file():
        cfg = load_config(str(sibling))
        return cfg.with_overrides({"plan": str(path.resolve())})
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if isinstance(data, dict) and "units" in data:
        raise ConfigError(
            [
                Problem(
                    str(path),
                    f"a plan without its run config: put the run config at {sibling} "
                    "(what `rpeg plan --out PLAN.yaml` writes) or pass the run config",
                )
            ]
        )
    return load_config(str(path))


def bench(
    plan: Path = typer.Argument(
        ...,
        help="a plan written by `rpeg plan --out PLAN.yaml` (its PLAN.config.yaml is "
        "the run config) or a run config",
    ),
    baselines: bool = typer.Option(
        False, "--baselines", help="also run the planner's verl-, ReaL- and AReaL-style plans"
    ),
    steps: int = typer.Option(4, "--steps", min=2, help="RL steps per plan"),
    skip: int = typer.Option(1, "--skip", min=0, help="warm-up steps left out of the median"),
    out: Path = typer.Option(Path("runs/bench"), "--out", help="folder of the runs"),
    artifact: bool = typer.Option(
        True, "--artifact/--no-artifact", help="run as a Prefect flow with a markdown artifact"
    ),
) -> None:
    """Run the chosen plan (and with --baselines each baseline plan) for N steps on this
    cluster and print predicted vs measured step time and speedup side by side."""
    from rpeg.cli.perf import plan_model_known
    from rpeg.compile.sources import resolve
    from rpeg.errors import ConfigError, Problem
    from rpeg.flows.bench import BenchEntry, bench_flow, run_entries, table
    from rpeg.perf import predict
    from rpeg.perf.calibration.fit import run_workload
    from rpeg.perf.calibration.run_lengths import configured_workload

    if skip >= steps:
        raise ConfigError([Problem("--skip", f"{skip} leaves no step of --steps {steps}")])
    cfg = _config_for(plan)
    graph, chosen = resolve(None, cfg)
    # compile's default plan, or the config's own plan section, names the built-in model
    from rpeg.cli.perf import folder_plan

    chosen = folder_plan(chosen, cfg)
    plan_model_known(chosen, cfg, plan)  # a model known only by its folder: read from it
    from rpeg.preflight import preflight

    # a plan this machine cannot run (a GPU cluster's plan, more devices than CPUs) is
    # refused now, not after a Prefect server and one failed run per plan
    preflight(cfg.with_overrides({"runtime.output_dir": str(out / "chosen")}))
    # the config's lengths, else those `rpeg calibrate` measured for this model and task
    wl = configured_workload(cfg, chosen.cluster)
    plans = {"chosen": (chosen, graph, "the plan given")}
    if baselines:
        from rpeg.search.optimizer import optimize_problem
        from rpeg.search.problem import problem_from_config

        result = optimize_problem(problem_from_config(cfg))
        for name, bl in result.baselines.items():
            if bl.candidate is None or name not in ("verl", "real", "areal"):
                continue
            c = bl.candidate
            p, desc = c.plan, bl.description
            if p.partial_rollout:  # AReaL's interruptible rollout: not what this runtime runs
                p = p.model_copy(update={"partial_rollout": False})
                desc += " (run and priced without partial rollout: the runtime has none)"
            plans[name] = (p, c.structure.graph(result.problem.base), desc)
    out.mkdir(parents=True, exist_ok=True)
    entries, graphs = [], {}
    for name, (p, g, desc) in plans.items():
        plan_path = out / f"{name}.plan.yaml"
        plan_path.write_text(p.to_yaml())
        run_cfg = cfg.with_overrides({"plan": str(plan_path.resolve())})
        cfg_path = out / f"{name}.config.yaml"
        cfg_path.write_text(run_cfg.to_yaml())
        graphs[name] = (g, p)
        entries.append(BenchEntry(name, desc, cfg_path, predict(g, p, wl).step_s))

    def reprice(e: BenchEntry, measured) -> float | None:
        g, p = graphs[e.name]
        at = run_workload(g, p, wl, measured)  # its lengths (and a multi-turn run's turns)
        return predict(g, p, at).step_s if at is not wl else None

    typer.echo(f"running {len(entries)} plan(s) x {steps} steps into {out}/ ...", err=True)
    if artifact:
        res = bench_flow(entries, steps, out, skip, "chosen", reprice)
    else:
        res = run_entries(entries, steps, out, skip=skip, reprice=reprice)
    for line in table(res, "chosen"):
        typer.echo(line)
    for note in wl.assumed:
        typer.echo(f"predicted s: {note}")
    if any(r.measured_s is None for r in res):
        raise typer.Exit(1)
