"""``rpeg train``: run RL training (``--local``: the single-process reference trainer)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: str | None = typer.Argument(
            None, help="run config YAML (path or fsspec URL); none = the built-in task"
        ),
        local: bool = typer.Option(
            False, "--local", help="run in this process with the reference trainer"
        ),
        steps: int | None = typer.Option(
            None, "--steps", help="RL steps (overrides runtime.steps)"
        ),
        summary_json: str | None = typer.Option(
            None, "--summary-json", help="write a JSON summary here"
        ),
        out: str | None = typer.Option(
            None, "--out", help="output dir (overrides runtime.output_dir)"
        ),
        quiet: bool = typer.Option(False, "--quiet", help="no per-step lines"),
    ) -> None:
        """Train a policy with RL. Writes metrics.jsonl and reward_curve.png to the output dir."""
        from rpeg.config import RunConfig

        cfg = RunConfig.from_yaml(config) if config else RunConfig()
        if not local:
            from rpeg.errors import RpegError

            # RpegError -> message on stderr and exit code 2 (see rpeg.cli.main)
            raise RpegError(
                "the distributed runtime (Prefect + Dask) is not available yet; "
                "run `rpeg train --local [CONFIG]` for the single-process trainer"
            )
        overrides = {}
        if steps is not None:
            overrides["runtime.steps"] = steps
        if out is not None:
            overrides["runtime.output_dir"] = out
        if overrides:
            cfg = cfg.with_overrides(overrides)
        from rpeg.runtime.local import LocalTrainer

        log = (lambda s: None) if quiet else (lambda s: typer.echo(s))
        trainer = LocalTrainer(cfg, log=log)
        summary = trainer.run()
        out_dir = Path(cfg.runtime.output_dir)
        typer.echo(
            f"done: {summary['steps']} steps in {summary['wall_s']:.1f}s "
            f"(median step {summary['median_step_s']:.2f}s); reward {summary['reward_first10']:.3f} -> "
            f"{summary['reward_last10']:.3f}; held-out greedy accuracy {summary['heldout_acc_before']:.3f} -> "
            f"{summary['heldout_acc_after']:.3f}; outputs in {out_dir}/ (metrics.jsonl, reward_curve.png)"
        )
        if summary_json:
            p = Path(summary_json)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(summary, indent=2))
