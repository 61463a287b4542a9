"""``rpeg eval SOURCE --data FILE [--samples k] [--json]``: accuracy and pass@k per data
source of a checkpoint, a Hugging Face folder or a run folder (rpeg.runtime.model_eval)."""

from __future__ import annotations

import typer

from rpeg.cli import json_out


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(
        source: str = typer.Argument(
            ...,
            help="a run folder (holding its config.yaml), an rpeg checkpoint (step folder, a "
            "run's checkpoint folder) or a Hugging Face model folder",
        ),
        overrides: list[str] | None = typer.Argument(
            None,
            help="dotted overrides of the config, e.g. task.answer_key=reward_model.ground_truth "
            "workload.max_response_tokens=512",
        ),
        data: str = typer.Option(
            ..., "--data", help="the data file: JSONL, Parquet or a datasets folder"
        ),
        samples: int = typer.Option(
            1, "--samples", help="answers per prompt: 1 = greedy; k > 1 = sampled, pass@k"
        ),
        config: str | None = typer.Option(
            None,
            "--config",
            help="a run config for the task's columns, chat template, rewards and lengths "
            "(a run folder's own config.yaml is read without it)",
        ),
        model: str | None = typer.Option(
            None,
            "--model",
            help="the model folder a checkpoint was trained from (default: the config's "
            "model.path; none for the built-in tiny model)",
        ),
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Accuracy and pass@k of a model on a data file, per data source.

        Accuracy is the mean over the samples (greedy with --samples 1); with --samples
        k > 1 also pass@k. Rows are grouped by their data_source column and scored by the
        task's rewards (task.reward_by_source)."""

        from rpeg.cli.overrides import parse_overrides
        from rpeg.runtime.model_eval import evaluate_model, report_lines

        result = evaluate_model(
            source,
            data,
            samples=samples,
            config_path=config,
            model_path=model,
            overrides=parse_overrides(list(overrides or [])),
            log=None if as_json else typer.echo,
        )
        if as_json:
            typer.echo(json_out.dumps(result, indent=1))
        else:
            for line in report_lines(result):
                typer.echo(line)
