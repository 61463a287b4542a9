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


def test_console_leaves_out_the_traceback_of_known_errors_only():
    """Prefect's console logs an RpegError (e.g. a full disk at a checkpoint) by its message
    alone; any other exception keeps its traceback; the record is unchanged for the
    handlers after (Prefect's API log handler)."""
    import logging
    import sys

    from rpeg.cli.console import NoTracebackForKnownErrors
    from rpeg.errors import ConfigError

    fmt = NoTracebackForKnownErrors(logging.Formatter("%(levelname)s %(message)s"))

    def record(exc):
        try:
            raise exc
        except Exception:
            info = sys.exc_info()
        return logging.LogRecord(
            "prefect.task_runs", logging.ERROR, __file__, 1, "failed", (), info
        )

    known = record(ConfigError(["disk full"]))
    assert fmt.format(known) == "ERROR failed"
    assert known.exc_info is not None and known.exc_info[0] is ConfigError  # restored
    assert "Traceback" in logging.Formatter().format(known)  # the next handler still sees it
    other = fmt.format(record(ValueError("boom")))
    assert other.startswith("ERROR failed") and "Traceback" in other and "ValueError: boom" in other
