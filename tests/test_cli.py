"""The `rpeg` entry point: help lists the commands, errors exit 2 without a traceback."""

import subprocess
import sys

from rpeg.cli import COMMAND_MODULES, app, main


def test_help_lists_every_registered_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    names += [g.name for g in app.registered_groups]
    assert names, "no command registered"
    for name in names:
        assert name in out


def test_command_modules_all_import_and_register():
    import importlib

    for name in COMMAND_MODULES:
        assert callable(importlib.import_module(name).register)


def test_help_does_not_import_heavy_libraries():
    code = (
        "import sys; from rpeg.cli import main; main(['--help']);"
        "heavy=[m for m in ('torch','prefect','dask','distributed','transformers') if m in sys.modules];"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "HEAVY []" in out


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["no-such-command"]) == 2
