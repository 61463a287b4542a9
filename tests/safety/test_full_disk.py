"""Issue 44, item 10: a write that fails on a full disk names its file (exit 2), instead of a
bare ``OSError: [Errno 28] No space left on device``. ``/dev/full`` is a disk that is always
full: every write to it fails with ENOSPC."""

from __future__ import annotations

import errno
import os

import pytest

from rpeg.cli.write_errors import write_error_message

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


def test_a_failed_write_without_a_file_in_the_error_is_named_from_its_frame():
    with pytest.raises(OSError) as got, open("/dev/full", "w") as fh:
        fh.write("x" * 100_000)
    assert got.value.errno == errno.ENOSPC and got.value.filename is None  # what Python says
    msg = write_error_message(got.value)
    assert msg.startswith("disk full writing /dev/full")


def test_the_cli_names_the_file_and_exits_2(capsys):
    from rpeg.cli import main

    assert main(["config", "docs", "--out", "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert "disk full writing /dev/full" in err and "Traceback" not in err


def test_other_errors_are_left_alone():
    assert write_error_message(ValueError("x")) is None
    assert write_error_message(OSError(errno.EACCES, "denied")) is None
