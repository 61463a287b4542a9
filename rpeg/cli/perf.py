"""``rpeg validate``, ``rpeg predict`` and ``rpeg specs``: the performance model's commands."""

from __future__ import annotations

from pathlib import Path

import typer

from rpeg.cli import json_out


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("predict")(predict)
    specs_app = typer.Typer(
        help="Hardware and model catalogs.", no_args_is_help=False, invoke_without_command=True
    )
    specs_app.callback(invoke_without_command=True)(specs_list)
    specs_app.command("list")(specs_list_cmd)
    specs_app.command("calibrate")(specs_calibrate)
    specs_app.command("add-model")(specs_add_model)
    app.add_typer(specs_app, name="specs")
    app.command("calibrate")(calibrate_run)


def validate(
    csv_path: Path | None = typer.Argument(
        None,
        help="CSV in the schema of the shipped data sets (default: both published-run sets "
        "that ship with rpeg, rpeg/perf/data/published_runs.csv and published_runs2.csv)",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    alone: bool = typer.Option(
        False,
        "--alone",
        help="fit on the given file's sources only (default: the shipped data sets join the "
        "fit; the file's rows are the ones scored)",
    ),
) -> None:
    """Predict every row with a measured step time, in-sample and leave-one-source-out
    (every fitted quantity refitted without the source being scored), and report the error,
    the range coverage and the share predicted per data set, pooled, per source, per
    system and per stage; rows that cannot be predicted are listed with why."""
    from rpeg.errors import ConfigError, Problem
    from rpeg.perf.validation import loso
    from rpeg.perf.validation.loso_report import lines, to_json

    if csv_path is not None and csv_path.is_dir():
        raise ConfigError([Problem(str(csv_path), "is a folder; expected a CSV file")])
    if csv_path is not None and not csv_path.is_file():
        raise ConfigError([Problem(str(csv_path), "file not found")])
    shipped = loso.default_datasets()
    if csv_path is None:
        paths, report = shipped, list(shipped)
    else:
        # the file's rows are scored; the shipped sets join the fit (every fitted quantity
        # still leaves the scored source out) unless --alone
        label = csv_path.stem if csv_path.stem not in shipped else f"{csv_path.stem} (file)"
        paths = {label: csv_path, **({} if alone else shipped)}
        report = [label]
    scored, refused = loso.run(paths)
    if as_json:
        typer.echo(json_out.dumps(to_json(scored, refused, report), indent=1))
        return
    for line in lines(scored, refused, report):
        typer.echo(line)


def predict(
    plan_path: Path = typer.Argument(
        ...,
        help="a plan YAML (`rpeg plan --out PLAN.yaml`), or a run config with a plan "
        "section (its workload is the config's)",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="run YAML with the workload; default: PLAN.config.yaml next to the plan "
        "(what `rpeg plan --out PLAN.yaml` writes), else the built-in task's workload",
    ),
    gantt: Path | None = typer.Option(None, "--gantt", help="write a Gantt chart (.png or .svg)"),
    as_json: bool = typer.Option(False, "--json"),
    system: str = typer.Option(
        "rpeg",
        "--system",
        help="the system that executes the plan: rpeg (this machine's calibration, "
        "`rpeg calibrate`) or a published one (verl-fsdp, verl-megatron, nemo-rl-megatron, "
        "areal, slime-megatron, ...; docs/perf-model.md 'Systems'); unknown names take the "
        "pooled factors with a wider range",
    ),
) -> None:
    """Predict one RL step of a plan: per-stage time, memory, comm; step time, throughput, MFU."""
    from rpeg.perf import predict_plan
    from rpeg.perf.timeline import gantt as draw
    from rpeg.plan import Plan

    config_plan = _run_config_with_plan(plan_path)  # None: PLAN is a plan YAML
    if config_plan is not None:  # a run config: its own plan and workload
        if config is not None:
            from rpeg.errors import ConfigError, Problem

            raise ConfigError(
                [Problem("--config", f"{plan_path} is a run config: it is the workload")]
            )
        plan, config = config_plan, plan_path
    else:
        plan = Plan.from_yaml(plan_path)
    sibling = plan_path.with_name(plan_path.stem + ".config.yaml")
    if config is None and sibling.exists():
        config = sibling
        typer.echo(f"workload from {sibling}", err=True)
    elif config is None:
        typer.echo(
            "warning: no --config and no PLAN.config.yaml beside the plan: "
            "predicting the built-in task's workload",
            err=True,
        )
    from rpeg.preflight import load_config

    cfg = load_config(None if config is None else str(config))
    plan = folder_plan(plan, cfg)  # a config's own plan section: the folder's model
    plan_model_known(plan, cfg, config)
    from rpeg.perf import build_graph
    from rpeg.perf.calibration import DEFAULT, SHIPPED
    from rpeg.perf.calibration.run_lengths import configured_workload
    from rpeg.perf.interval import Unknowns, predict_interval
    from rpeg.perf.systems import normalise, system_params, widen

    wl = configured_workload(cfg, plan.cluster)  # lengths `rpeg calibrate` measured, if any
    sysname = normalise(system) or "rpeg"
    params = None if sysname == "rpeg" else system_params(sysname)
    calib = DEFAULT if params is None else params.calibration(SHIPPED)
    pred = predict_plan(plan, wl, algorithm=cfg.algorithm, calib=calib)
    low, high = predict_interval(
        build_graph(plan, cfg.algorithm),
        plan,
        wl,
        calib,
        unknown=Unknowns(response_length=wl.mean_response_tokens is None),
        point=pred.step_s,
    )
    if params is not None:  # the system's leave-one-source-out spread
        low, high = widen(pred.step_s, low, high, params)
    if gantt:
        draw(
            pred.timeline,
            str(gantt),
            title=f"{plan.model} on {plan.cluster}: {pred.step_s:.1f} s/step",
        )
    peaks, why = _rank_peaks(plan, cfg)
    if as_json:
        typer.echo(
            json_out.dumps(
                {
                    **pred.to_dict(),
                    "predicted_low_s": low,
                    "predicted_high_s": high,
                    "system": sysname,
                    "rank_memory": [p.to_dict() for p in peaks],
                },
                indent=1,
            )
        )
        return
    typer.echo(
        f"{'unit':16s} {'devices':>10s} {'time_s':>10s} {'TFLOP':>10s} {'comm_s':>8s} {'mem_GB':>8s}"
    )
    for s in pred.stages.values():
        typer.echo(
            f"{s.name:16s} {s.devices:>10s} {s.time_s:10.3f} {s.flops / 1e12:10.2f} "
            f"{sum(s.comm_s.values()):8.3f} {s.peak_memory_gb:8.2f}"
        )
    typer.echo(
        f"step={pred.step_s:.3f}s (range {low:.3f}-{high:.3f}s, "
        f"-{100 * (1 - low / pred.step_s):.0f}%/+{100 * (high / pred.step_s - 1):.0f}%) "
        f"tokens/s/GPU={pred.tokens_per_s_per_gpu:,.1f} MFU={100 * pred.mfu:.1f}% "
        f"devices={pred.num_devices} system={sysname}"
    )
    if params is not None:
        typer.echo(
            f"system {sysname}: rollout x{params.gen_eff:.2f}, training x{params.train_eff:.2f} "
            f"of the modelled rate ({params.rows} published rows, {params.sources} sources)"
        )
    for p in peaks:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in p.parts.items() if v >= 0.005)
        typer.echo(
            f"rank memory: group {p.group} ({p.ranks} ranks): {p.peak_gb:.2f} GB peak per rank "
            f"in {p.phase} ({parts})"
        )
    if why:
        typer.echo(f"rank memory: not predicted ({why})")
    for a in pred.assumptions:
        typer.echo(f"assumption: {a}")
    if gantt:
        typer.echo(f"gantt: {gantt}")


def _rank_peaks(plan, cfg) -> tuple[list, str]:
    """Each actor group's predicted peak per rank as the runtime would build the plan
    (rpeg.compile.memory), and why not when the plan does not compile for this run."""
    from rpeg.compile import compile_step
    from rpeg.compile.memory import rank_peaks
    from rpeg.errors import RpegError
    from rpeg.specs.hf import priced_model

    try:
        model = priced_model(cfg.model)
        step = compile_step(plan, cfg, cluster_devices=plan.num_devices, model=model)
        return rank_peaks(step, cfg, model), ""
    except RpegError as exc:
        problems = getattr(exc, "problems", None)
        if problems:  # name each: what `rpeg train` would refuse, and why
            said = "; ".join(f"{p.where}: {p.what}" for p in problems)
            return [], f"rpeg train refuses this plan: {said}"
        return [], str(exc).splitlines()[0]


def _run_config_with_plan(path: Path):
    """The plan of the run config at ``path`` (its ``plan`` section, inline or a file), or
    None when ``path`` is a plan YAML. A run config without a plan is refused, naming how to
    get one."""
    import yaml

    from rpeg.errors import ConfigError, Problem

    if not path.is_file():
        raise ConfigError([Problem(str(path), "file not found (a plan YAML or a run config)")])
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or "units" in data:
        return None  # a plan (Plan.from_yaml names its problems)
    from rpeg.compile.sources import resolve
    from rpeg.preflight import load_config

    cfg = load_config(str(path))
    if cfg.plan is None:
        raise ConfigError(
            [
                Problem(
                    str(path),
                    "a run config without a plan section: plan it with "
                    f"`rpeg plan {path} --out PLAN.yaml`, then `rpeg predict PLAN.yaml`",
                )
            ]
        )
    return resolve(None, cfg)[1]


def folder_plan(plan, cfg):
    """``plan`` naming the run config's model folder where the config prices its folder
    (``model.path`` set, ``model.name`` at its default) and the plan names that default (a
    config's own plan section, compile's default plan): otherwise the performance model
    would price the built-in tiny model instead of the folder's."""
    from rpeg.specs.hf import priced_model, prices_folder

    if not prices_folder(cfg.model):
        return plan
    spec = priced_model(cfg.model)  # known by its name in this process (a plan file names it)
    return plan.model_copy(update={"model": spec.name}) if plan.model == cfg.model.name else plan


def plan_model_known(plan, cfg, config_path: Path | str | None) -> None:
    """Make the model ``plan`` names known to the performance model: a model known only by
    its folder (``rpeg plan`` of a config whose ``model.path`` is set and ``model.name`` left
    at its default names the plan after the folder) is read from the run config's folder,
    the same reading as ``rpeg specs add-model --from-hf``. A name neither the catalog nor
    the config's folder knows is refused, naming what to pass."""
    from rpeg import specs
    from rpeg.errors import ConfigError, Problem
    from rpeg.specs import SpecError
    from rpeg.specs.hf import priced_model, prices_folder

    if prices_folder(cfg.model):
        priced_model(cfg.model)  # the folder's spec, known by its name in this process
    try:
        specs.model(plan.model)
    except SpecError:
        used = f"of the run config {config_path}" if config_path else "(no run config given)"
        raise ConfigError(
            [
                Problem(
                    "plan.model",
                    f"{plan.model!r} is not a catalog model and not the model folder "
                    f"{used}; pass --config RUN.yaml whose model.path is that folder (what "
                    "`rpeg plan RUN.yaml --out PLAN.yaml` writes beside the plan as "
                    "PLAN.config.yaml), or add it: rpeg specs add-model --from-hf "
                    f"FOLDER/config.json --name {plan.model}",
                )
            ]
        ) from None


def specs_list(ctx: typer.Context) -> None:
    """List the GPU, cluster and model catalogs."""
    if ctx.invoked_subcommand:
        return
    _print_catalogs()


def specs_list_cmd() -> None:
    """List the GPU, cluster and model catalogs (same as `rpeg specs`)."""
    _print_catalogs()


def _print_catalogs() -> None:
    from rpeg import specs
    from rpeg.specs.models import format_params

    typer.echo("GPUs:")
    for g in specs.gpus().values():
        typer.echo(
            f"  {g.name:12s} bf16 {g.bf16_dense_tflops:7.1f} TF  HBM {g.hbm_gb:6.0f} GB {g.hbm_tbps:5.2f} TB/s"
        )
    typer.echo("Clusters:")
    for c in specs.clusters().values():
        typer.echo(
            f"  {c.name:14s} {c.gpu.name:10s} {c.gpus_per_node}/node x {c.num_nodes} nodes ({c.fabric})"
        )
    typer.echo("Models:")
    for m in specs.models().values():
        if m.unsupported:
            typer.echo(f"  {m.name:32s} (not costed: {m.unsupported[:50]})")
        else:
            typer.echo(
                f"  {m.name:32s} {format_params(m.params):>9s} params, "
                f"{format_params(m.active_params):>9s} active, {m.kind}"
            )


def specs_calibrate(
    seconds: float = typer.Option(2.0, help="time budget of each micro-benchmark"),
    out: Path | None = typer.Option(None, help="file to write (default: user specs dir gpus.yaml)"),
) -> None:
    """Measure this machine's CPU matmul rate and memory bandwidth; write the `cpu` profile."""
    import time

    import numpy as np
    import yaml

    from rpeg import specs

    def rate(fn, work: float) -> float:
        fn()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2:
            fn()
            n += 1
        return work * n / (time.perf_counter() - t0)

    # The runtime's actors run torch with one thread per process (one "device" = one core):
    # measure the same (numpy fallback when torch is missing).
    try:
        import torch

        torch.set_num_threads(1)

        def mm(n: int):
            a, b = torch.rand(n, n), torch.rand(n, n)
            return lambda a=a, b=b: a @ b

        src_t, dst_t = torch.ones(16 * 1024 * 1024), torch.empty(16 * 1024 * 1024)
        lib = "torch fp32, 1 thread"

        def copy() -> None:
            dst_t.copy_(src_t)

        nbytes = 2.0 * src_t.numel() * 4
    except ImportError:  # pragma: no cover - torch is a dependency of the runtime

        def mm(n: int):
            a = np.random.rand(n, n).astype(np.float32)
            b = np.random.rand(n, n).astype(np.float32)
            return lambda a=a, b=b: a @ b

        src, dst = np.ones(16 * 1024 * 1024, np.float32), np.empty(16 * 1024 * 1024, np.float32)
        lib = "numpy fp32"

        def copy() -> None:
            np.copyto(dst, src)

        nbytes = 2.0 * src.nbytes

    points = []
    for size in (32, 64, 128, 256, 512, 1024):
        points.append((2.0 * size**3, rate(mm(size), 2.0 * size**3)))
    peak = max(r for _, r in points)
    bw = rate(copy, nbytes)
    import math

    curve = [[round(math.log10(f), 3), round(min(1.0, max(0.01, r / peak)), 3)] for f, r in points]
    overhead_ms = 0.0
    if lib.startswith("torch"):
        from rpeg.runtime.overhead_probe import eager_layer_overhead_s

        overhead_ms = eager_layer_overhead_s(peak) * 1e3
    entry = {
        "bf16_dense_tflops": round(peak / 1e12, 6),
        "fp8_dense_tflops": None,
        "hbm_gb": 8,
        "hbm_tbps": round(bw / 1e12, 6),
        "efficiency": {"matmul": curve, "hbm": [[3.0, 0.2], [5.0, 0.6], [7.0, 1.0]]},
        "layer_overhead_ms": round(overhead_ms, 4),
        "calibrated": True,
        "source": f"measured by `rpeg specs calibrate` on {time.strftime('%Y-%m-%d')} ({lib} matmul, copy; 1 device = 1 core)",
    }
    path = out or specs.user_specs_dir() / "gpus.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    data.setdefault("gpus", {})["cpu"] = entry
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    specs.reload()
    typer.echo(
        f"cpu: {peak / 1e9:.1f} GFLOP/s matmul, {bw / 1e9:.1f} GB/s copy, "
        f"{overhead_ms:.2f} ms eager overhead per layer per pass -> {path}"
    )


def specs_add_model(
    from_hf: Path = typer.Option(..., "--from-hf", help="a local Hugging Face config.json"),
    name: str | None = typer.Option(
        None, "--name", help="catalog name (default: the config's folder name, lower case)"
    ),
    kind: str = typer.Option(
        "instruct",
        "--kind",
        help="base | instruct | reasoning: sets the response-length prior (docs/perf-model.md)",
    ),
    out: Path | None = typer.Option(None, help="file to write (default: user models.yaml)"),
) -> None:
    """Add a model to the user catalog from its HF config.json (read as JSON, never run)."""
    from rpeg import specs
    from rpeg.specs.hf import add_model

    name = name or from_hf.resolve().parent.name.lower()
    path, entry = add_model(from_hf, name, kind=kind, out=out)
    specs.reload()
    m = specs.model(name) if out is None else None
    from rpeg.specs.models import format_params

    size = (
        f": {format_params(m.params)} params, {format_params(m.active_params)} active" if m else ""
    )
    typer.echo(f"{name} ({entry['family']}, {entry['kind']}){size} -> {path}")


def calibrate_run(
    run_dir: Path = typer.Argument(
        ..., help="a run's output folder (timeline.json, metrics.jsonl)"
    ),
    config: Path | None = typer.Option(
        None, "--config", help="the run's YAML (default: RUN_DIR/config.yaml)"
    ),
    out: Path | None = typer.Option(None, help="file to write (default: user calibration.yaml)"),
    skip: int = typer.Option(1, help="warm-up steps left out"),
    runtime_s: float | None = typer.Option(
        None,
        "--runtime-s",
        help="the runtime's own seconds per step on this cluster, as "
        "benchmarks/bench_overhead.py measures it: the step overhead comes from it "
        "(default: the measured step minus the predicted units)",
    ),
    collective_ms: float | None = typer.Option(
        None,
        "--collective-ms",
        help="one collective call's latency inside a pass on this machine, as "
        "benchmarks/bench_collectives.py measures it (its SUMMARY): priced for the "
        "collectives context and pipeline parallelism issue per layer and per tensor "
        "(default: the cluster catalog's, or what an earlier calibrate was given)",
    ),
) -> None:
    """Fit this machine's efficiencies and fixed costs from a measured run; later
    predictions on the run's cluster use them. A multi-turn run's turn shape (mean turns,
    tokens per turn and per observation, environment latency) is fitted too and kept for
    later predictions of the same model and task."""
    from rpeg.compile.sources import resolve
    from rpeg.errors import ConfigError, Problem
    from rpeg.perf.calibration import fit
    from rpeg.perf.prediction import Workload

    config = config or run_dir / "config.yaml"
    if not config.is_file():
        raise ConfigError(
            [Problem("--config", f"{config} not found: pass the run's YAML with --config")]
        )
    from rpeg.preflight import load_config

    cfg = load_config(str(config))
    graph, plan = resolve(None, cfg)
    plan = folder_plan(plan, cfg)  # a model folder's run: priced as the folder's model
    wl = Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)
    measured = fit.read_run(run_dir, skip=skip)
    shaped = False  # a multi-turn run's turn shape fitted (printed at the end)
    if wl.turns is not None:  # multi-turn: priced at the run's measured turn shape
        if measured.turns is None:
            typer.echo("turns: no turns_mean in metrics.jsonl; priced at the config's shape")
        else:
            from rpeg.perf.calibration import turn_fit

            pred = fit.predictor(graph, plan, wl, measured)
            wl, lines = turn_fit.fit_workload(wl, measured.turns, pred)
            for line in lines:
                typer.echo(f"turns: {line}")
            shaped = True
    collective_s = None if collective_ms is None else collective_ms / 1e3
    if collective_s is None:  # measured by an earlier calibrate of this cluster: kept
        from rpeg.perf.calibration import machine_calibration

        collective_s = machine_calibration(plan.cluster).fitted_collective_latency_s
    values, lines = fit.fit(
        fit.predictor(graph, plan, wl, measured),
        measured,
        runtime_s=runtime_s,
        collective_s=collective_s,
    )
    at = fit.measured_workload(wl, measured)
    if at is not wl:
        typer.echo(
            f"lengths: measured {at.mean_prompt_tokens:.4g} prompt + "
            f"{at.mean_response_tokens:.4g} response tokens per sample"
        )
    for line in lines:
        typer.echo(line)
    path = fit.write(plan.cluster, values, f"rpeg calibrate {run_dir}", out)
    if at is not wl and wl.turns is None:  # kept for predictions of this model and task
        from rpeg.perf.calibration import run_lengths as RL

        prompt = at.mean_prompt_tokens if at.mean_prompt_tokens != wl.mean_prompt_tokens else None
        found = RL.RunLengths(at.mean_response_tokens, prompt, at.length_sigma, str(run_dir))
        RL.store(plan.cluster, RL.task_key(cfg), found, out)
        sig = f" and length sigma {at.length_sigma:.3g}" if at.length_sigma else ""
        typer.echo(f"lengths{sig} kept for later predictions of {RL.task_key(cfg)}")
    typer.echo(
        ", ".join(f"{k}={v:.4g}" for k, v in values.items()) + f" -> {path} [{plan.cluster}]"
    )
    if shaped:  # kept for predictions of this model and task: docs/multiturn.md
        from rpeg.perf.calibration import turn_store as TS
        from rpeg.perf.calibration.run_lengths import task_key
        from rpeg.perf.calibration.turn_fit import config_lines

        t = wl.turns
        response = at.mean_response_tokens if at is not wl else None
        prompt = at.mean_prompt_tokens if at.mean_prompt_tokens != wl.mean_prompt_tokens else None
        kept = TS.StoredTurns(
            mean_turns=t.turns,
            observation_tokens=t.observation_tokens,
            env_latency_s=t.env_latency_s,
            mean_turn_tokens=t.mean_turn_tokens,
            prompt_tokens=prompt,
            response_tokens=response,
            source=str(run_dir),
        )
        key = TS.turn_key(cfg, task_key(cfg))
        TS.store(plan.cluster, key, kept, out)
        typer.echo(f"turn shape kept for later predictions of {key}")
        typer.echo("(a value the config states wins; to state them:)")
        for line in config_lines(t, response, prompt):
            typer.echo(f"  {line}")
