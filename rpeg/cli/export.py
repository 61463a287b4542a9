"""``rpeg export CHECKPOINT --out DIR``: a checkpoint's policy as a Hugging Face folder."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        checkpoint: str = typer.Argument(
            ...,
            help="a step folder, a checkpoint run folder, a checkpoint URL holding one run, "
            "or a run's output folder (runs/<run>: its config.yaml names the rest)",
        ),
        out: str = typer.Option(..., "--out", help="the Hugging Face folder to write"),
        model: str | None = typer.Option(
            None,
            "--model",
            help="the model folder the run trained (config.json, tokenizer); "
            "default: --config's model.path, or the built-in tiny model",
        ),
        config: str | None = typer.Option(
            None, "--config", help="the run's config (for its model.path)"
        ),
        dtype: str | None = typer.Option(
            None, "--dtype", help="float32 | bfloat16 | float16 (default: as trained)"
        ),
        force: bool = typer.Option(
            False,
            "--force",
            help="write into a non-empty --out that holds a previous export (its "
            "rpeg-export.json): only that export's files are replaced; other files never",
        ),
    ) -> None:
        """Write the checkpoint's policy (trainer.pt, rank states, or a sharded group's
        torch.distributed.checkpoint shards, read in this process) as an HF folder
        (config.json, model.safetensors, tokenizer files) that transformers'
        AutoModelForCausalLM and vLLM load; a LoRA run (model.lora, needs --config) also
        writes peft's adapter to OUT/adapter. A non-empty OUT is refused (exit 2) unless
        --force, and --force replaces only the files a previous export listed in
        OUT/rpeg-export.json."""
        from rpeg.runtime.export_out import check_out

        check_out(out, force)  # a refusal before torch and the checkpoint are loaded
        from rpeg.runtime.export import export_checkpoint

        run = None
        from rpeg.runtime import run_folder as RF

        kept = RF.checkpoints_of(checkpoint)  # an output run folder: its config.yaml says
        if kept is not None:  # where its checkpoints are, and which model it trained
            config = config or str(RF.config_in(checkpoint))
            checkpoint = kept
        if config is not None:
            from rpeg.preflight import load_config

            run = load_config(config)  # a LoRA run's base model and model.lora too
            model = run.model.path if model is None else model
        where = export_checkpoint(
            checkpoint,
            out,
            model_path=model,
            dtype=dtype,
            log=typer.echo,
            config=run,
            force=force,
        )
        typer.echo(f"exported {where} to {out}")
