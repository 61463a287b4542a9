"""The ``rpeg`` command line.

Each command group lives in its own module under ``rpeg/cli/`` and exposes
``register(app: typer.Typer) -> None``; add a module name to ``COMMAND_MODULES`` to slot a
new command in. Command modules import heavy libraries (torch, prefect, dask) inside the
command functions, so ``rpeg --help`` stays fast.

Any :class:`rpeg.errors.RpegError` becomes its message on stderr and exit code 2; a
traceback is shown only with ``--debug``. Ctrl-C ends a command with exit code 130
(``rpeg train`` first says what it kept: rpeg.infra.interrupts).
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

COMMAND_MODULES: list[str] = [
    "rpeg.cli.train",
    "rpeg.cli.graph",
    "rpeg.cli.perf",
    "rpeg.cli.deploy",
    "rpeg.cli.plan",
    "rpeg.cli.config_cmd",
    "rpeg.cli.export",
    "rpeg.cli.eval",
    "rpeg.cli.bench",
]

app = typer.Typer(
    name="rpeg",
    help="RPEG: plan, predict and run RL training of reasoning LMs as an optimized pipeline graph.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="show full tracebacks on errors"),
) -> None:
    if debug:
        os.environ["RPEG_DEBUG"] = "1"


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)
importlib.import_module("rpeg.cli.help_text").reflow_help(app)  # paragraphs, not source lines


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rpeg`` script; returns the exit code."""
    from rpeg.errors import RpegError

    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        # non-standalone typer returns (not raises) an exit status: typer.Exit(n), and 130
        # for Ctrl-C; the commands themselves return None
        code = app(args=args, prog_name="rpeg", standalone_mode=False)
    except RpegError as exc:
        if debug:
            raise
        typer.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 1
    except Exception as exc:  # usage errors come through here in non-standalone mode
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click's/typer's ClickException
            exc.show()
            return exc.exit_code
        if debug:
            raise
        from rpeg.cli.write_errors import write_error_message

        full = write_error_message(exc)  # a full disk names its file, exit 2 (issue 44)
        if full:
            typer.echo(f"error: {full}", err=True)
            return 2
        typer.echo(
            f"error: {type(exc).__name__}: {exc}\n(run with --debug for the traceback)", err=True
        )
        return 1
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
