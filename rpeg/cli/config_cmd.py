"""``rpeg config show [CONFIG] [FIELD=VALUE ...]``: the merged run config with every default,
as YAML (what ``rpeg train`` with the same arguments would run with);
``rpeg config docs``: write docs/config.md, the reference generated from the schema."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="the run configuration: show it merged, or write its reference")
    app.add_typer(group, name="config")

    @group.command("show")
    def show(
        config: str | None = typer.Argument(None, help="run config YAML; none = the defaults"),
        overrides: list[str] | None = typer.Argument(
            None, help="dotted overrides, e.g. runtime.steps=2", show_default=False
        ),
    ) -> None:
        """Print the merged config (file + overrides + defaults) as YAML."""
        from rpeg.cli.overrides import load_with_overrides

        typer.echo(load_with_overrides(config, overrides).to_yaml(), nl=False)

    @group.command("docs")
    def docs(
        out: str = typer.Option("docs/config.md", "--out", help="where to write the reference"),
    ) -> None:
        """Regenerate the config reference (docs/config.md) from the schema."""
        from pathlib import Path

        from rpeg.cli.config_docs import render_config_docs

        Path(out).write_text(render_config_docs())
        typer.echo(f"wrote {out}")
