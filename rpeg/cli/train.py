"""``rpeg train``: RL training on the distributed runtime (Prefect drives, Dask executes);
``--local`` runs the single-process reference trainer instead."""

from __future__ import annotations

import os
from pathlib import Path

import typer


def _echo_summary(summary: dict, out_dir: Path, extra: str = "") -> None:
    from rpeg.runtime.summary import heldout_phrase

    n, total = summary.get("steps_run", summary["steps"]), summary["steps"]
    typer.echo(
        f"done: {n} steps{'' if n == total else f' (now {total} in all)'} in {summary['wall_s']:.1f}s "
        f"(median step {summary['median_step_s']:.2f}s); reward {summary['reward_first10']:.3f} -> "
        f"{summary['reward_last10']:.3f}; {heldout_phrase(summary)}; outputs in {out_dir}/ ({extra})"
    )
    for line in memory_lines(summary):
        typer.echo(line)


def memory_lines(summary: dict) -> list[str]:
    """One line per actor group: each rank's measured peak memory beside the predicted one
    (rpeg.compile.memory), when the run measured them (the distributed runtime)."""
    measured = summary.get("peak_memory") or {}
    predicted = summary.get("predicted_peak_memory") or {}
    out = []
    for group, ranks in measured.items():
        peaks = [r.get("peak_rss_bytes", 0) / 1e9 for r in ranks if isinstance(r, dict)]
        if not peaks:
            continue
        pred = predicted.get(group, {}).get("peak_gb")
        vs = f"; predicted {pred:.2f} GB per rank" if pred else ""
        out.append(
            f"memory: group {group}: measured peak per rank "
            f"{', '.join(f'{p:.2f}' for p in peaks)} GB{vs}"
        )
    return out


def _announce(prepared, quiet: bool) -> None:
    """Where this run writes: its folder and its checkpoints."""
    if quiet:
        return
    rt = prepared.config.runtime
    for note in prepared.notes:
        typer.echo(note)
    where = f"outputs in {rt.output_dir}/"
    if rt.checkpoint_url:
        where += f"; checkpoints in {rt.checkpoint_url.rstrip('/')}/{rt.run_id}/"
    typer.echo(f"run id {rt.run_id}: {where}")


def _run(
    prepared,
    local: bool,
    cluster: str | None,
    resume: bool,
    quiet: bool,
    ticker,
    summary_json: str | None = None,
) -> dict:
    """Train the prepared run on the chosen runtime; the summary."""
    cfg = prepared.config
    out_dir = Path(cfg.runtime.output_dir)
    _announce(prepared, quiet)
    from rpeg.infra.lifeline import start_lifeline

    start_lifeline()  # services this command starts die with it, even on kill -9
    _take_sigint()
    if local:
        ticker.phase("loading the model")
        files = "config.yaml, metrics.jsonl, reward_curve.png"
    else:
        # quiet Prefect console logs (the progress bar is the live view); set before import
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
        ticker.phase("starting the Prefect API")
        from rpeg.infra.interrupts import start_ephemeral_api

        start_ephemeral_api()  # now, so that Ctrl-C leaves it up for the flow's crash record
        if not os.environ.get("RPEG_DEBUG"):
            from rpeg.cli.console import console_without_known_tracebacks

            console_without_known_tracebacks()
        files = "config.yaml, metrics.jsonl, timeline.json, compiled_step.yaml"
    from rpeg.flows.entry import train

    try:  # the one entry (as Python's and the deployments'), on the prepared run
        summary = train(
            cfg,
            local=local,
            cluster_address=cluster,
            resume=resume,
            summary_json=summary_json,
            progress=not quiet,
            prepared=prepared,
            log=(lambda s: None) if quiet else ticker.echo,
        )
    except KeyboardInterrupt:
        raise _interrupted(cfg) from None
    _echo_summary(summary, out_dir, files)
    return summary


#: the exit status of a command stopped by SIGINT (the shells' 128 + 2)
INTERRUPTED_EXIT = 130


def _take_sigint() -> None:
    """SIGINT stops the run (exit 130) even when it was started with SIGINT ignored, as a
    background job of a non-interactive shell is (``rpeg train ... &``, nohup): Python then
    installs no KeyboardInterrupt handler and ``kill -INT`` would do nothing (as ``rpeg
    deploy`` does for its own command)."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted(cfg) -> typer.Exit:
    """Ctrl-C: say what was kept and how to go on; exit 130."""
    rt = cfg.runtime
    if rt.checkpoint_url:
        where = f"{rt.checkpoint_url.rstrip('/')}/{rt.run_id}/"
        kept = f"checkpoints of run {rt.run_id} in {where}; `rpeg train ... --resume` continues"
    else:
        kept = "no checkpoints (runtime.checkpoint_url is not set)"
    typer.echo(f"interrupted: {kept}; metrics so far in {rt.output_dir}/", err=True)
    return typer.Exit(INTERRUPTED_EXIT)


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: str | None = typer.Argument(
            None, help="run config YAML (path or fsspec URL); none = the built-in task"
        ),
        overrides: list[str] | None = typer.Argument(
            None,
            help="dotted overrides after the config, e.g. algorithm.kl_coef=0.01 "
            "runtime.steps=2 (values read as YAML; validated like the file)",
            show_default=False,
        ),
        local: bool = typer.Option(
            False, "--local", help="run in this process with the single-process reference trainer"
        ),
        steps: int | None = typer.Option(
            None, "--steps", help="RL steps (overrides runtime.steps)"
        ),
        cluster: str | None = typer.Option(
            None,
            "--cluster",
            help="attach to a running Dask scheduler, e.g. tcp://host:8786 (default: a LocalCluster)",
        ),
        resume: bool = typer.Option(
            False,
            "--resume",
            help="continue this run (runtime.run_id, or the one run found at "
            "runtime.checkpoint_url) from its newest complete checkpoint",
        ),
        resume_from: str | None = typer.Option(
            None,
            "--resume-from",
            help="start from this checkpoint of any run (a step folder, a run folder, or a "
            "checkpoint URL holding one run); new checkpoints go under this run's id",
        ),
        allow_change: list[str] = typer.Option(  # noqa: B006 - typer's list default
            [],
            "--allow-change",
            help="with --resume: a field that may differ from the checkpoint (algorithm, "
            "staleness, layout, model); repeat for several (runtime.allow_change)",
        ),
        run_id: str | None = typer.Option(
            None, "--run-id", help="checkpoint run id (overrides runtime.run_id)"
        ),
        staleness: int | None = typer.Option(
            None,
            "--staleness",
            min=0,
            help="bound k on policy lag (overrides runtime.max_staleness)",
        ),
        summary_json: str | None = typer.Option(
            None, "--summary-json", help="write a JSON summary here"
        ),
        out: str | None = typer.Option(
            None,
            "--out",
            help="where run folders go (overrides runtime.output_dir): this run writes "
            "OUT/<run id>/ and points OUT/latest at it",
        ),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar / per-step lines"),
    ) -> None:
        """Train a policy with RL; writes its resolved config.yaml, metrics.jsonl, samples.jsonl
        (+ timeline.json, compiled_step.yaml on the distributed runtime) to its own run folder
        <output dir>/<run id>/, locked while it runs. Bad input (a plan that needs more devices
        than the cluster has, an unknown role, an unwritable checkpoint URL) is refused before
        any actor starts (exit 2)."""
        from rpeg.cli.overrides import load_with_overrides

        cfg = load_with_overrides(config, overrides)
        overrides: dict = {}
        if steps is not None:
            overrides["runtime.steps"] = steps
        if out is not None:
            overrides["runtime.output_dir"] = out
        if staleness is not None:
            overrides["runtime.max_staleness"] = staleness
        if resume:
            overrides["runtime.resume"] = True
        if resume_from is not None:
            overrides["runtime.resume_from"] = resume_from
        if run_id is not None:
            overrides["runtime.run_id"] = run_id
        if allow_change:
            overrides["runtime.allow_change"] = list(allow_change)
        if cluster is not None:
            overrides["cluster.address"] = cluster
        if overrides:
            cfg = cfg.with_overrides(overrides)
        if local and cluster is not None:
            from rpeg.errors import RpegError

            raise RpegError("--local and --cluster exclude each other")
        from rpeg.runtime.progress import startup_ticker

        ticker = startup_ticker(enabled=not quiet)  # a line at least every few seconds
        ticker.phase("reading the data and checking the config")
        # one preparation path (as a deployed run's and run_train's): the data's prompts
        # measured (max_prompt_tokens), the run id, the run folder, every check at once
        # (exit 2), the run's locks, its config.yaml
        from rpeg.preflight.prepare import prepare_run

        try:
            prepared = prepare_run(
                cfg,
                local=local,
                cluster_devices=None if cluster is None else 10**6,
                output_files={"--summary-json": summary_json},
                log=None if quiet else ticker.echo,
            )
        except BaseException:
            ticker.stop()
            raise
        try:
            _run(prepared, local, cluster, resume, quiet, ticker, summary_json)
        finally:
            ticker.stop()
            prepared.release()
