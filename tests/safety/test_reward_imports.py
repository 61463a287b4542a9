"""Issue 44, items 3 and 8: importing ``task.reward_modules`` is bounded. A module whose import
calls ``sys.exit(3)`` or hangs is a named problem of the field (exit 2 before start), not an
exit 3 with nothing printed or a silent hang."""

from __future__ import annotations

import time

import pytest

from rpeg.runtime import rewards


@pytest.fixture
def modules(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import_44.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "hangs_on_import_44.py").write_text("import time\ntime.sleep(600)\n")
    (tmp_path / "fine_plain_44.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_import_calling_sys_exit_is_a_named_problem(modules):
    (p,) = rewards.load_reward_modules(["exits_on_import_44"])
    assert p.where == "task.reward_modules[0]"
    assert "sys.exit(3)" in p.what and "exits_on_import_44" in p.what


def test_a_hanging_import_is_stopped_at_the_timeout(modules):
    t0 = time.monotonic()
    probs = rewards.load_reward_modules(["fine_plain_44", "hangs_on_import_44"], timeout_s=3)
    assert time.monotonic() - t0 < 20
    assert [p.where for p in probs] == ["task.reward_modules[1]"]  # the good one imports
    assert "did not finish within 3 s" in probs[0].what


def test_the_preflight_refuses_both_before_start(modules, monkeypatch):
    from rpeg.config import RunConfig
    from rpeg.preflight.inputs import check_task

    monkeypatch.setattr(rewards, "REWARD_IMPORT_TIMEOUT_S", 3.0)
    cfg = RunConfig().with_overrides(
        {"task.reward_modules": ["exits_on_import_44", "hangs_on_import_44"]}
    )
    t0 = time.monotonic()
    probs = [p for p in check_task(cfg) if p.where.startswith("task.reward_modules")]
    assert time.monotonic() - t0 < 30
    assert [p.where for p in probs] == ["task.reward_modules[0]", "task.reward_modules[1]"]
    assert "sys.exit(3)" in probs[0].what and "within 3 s" in probs[1].what
