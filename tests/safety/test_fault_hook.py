"""Issue 44, item 11: ``RPEG_FAULT_AT`` (a test hook that ends a rank's process) is read only
where tests enable fault injection (``RPEG_TEST_FAULTS=1``), and an enabled but malformed
point is refused by the preflight before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.preflight import preflight
from rpeg.runtime.actors.fault_points import ENABLE, ENV

CODE = (
    "from rpeg.runtime.actors.fault_points import fault_point\n"
    "fault_point('trainer', 1, 'train', 2)\n"
    "print('survived')\n"
)


def _run(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in (ENV, ENABLE)}
    env[ENV] = f"group=trainer rank=1 phase=train step=2 once={tmp_path / 'fired'}"
    env.update(extra)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)


def test_a_stray_fault_point_does_not_end_a_production_process(tmp_path):
    got = _run(tmp_path)
    assert got.returncode == 0 and "survived" in got.stdout
    assert not (tmp_path / "fired").exists()


def test_enabled_by_the_test_switch_it_fires(tmp_path):
    got = _run(tmp_path, **{ENABLE: "1"})
    assert got.returncode == 137


def _cfg(tmp_path):
    return RunConfig().with_overrides({"runtime.output_dir": str(tmp_path / "out")})


def test_an_enabled_malformed_point_is_refused_before_start(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "group=trainer rank=1 phase=dance step=2 once=/x")
    monkeypatch.setenv(ENABLE, "1")
    with pytest.raises(ConfigError, match="RPEG_FAULT_AT.*phase 'dance'"):
        preflight(_cfg(tmp_path), local=True)


def test_a_disabled_point_is_a_warning_not_a_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "group=trainer rank=1 phase=dance step=2 once=/x")
    monkeypatch.delenv(ENABLE, raising=False)
    with pytest.warns(UserWarning, match="RPEG_FAULT_AT is set but ignored"):
        preflight(_cfg(tmp_path), local=True)
