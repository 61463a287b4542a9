"""Issue 44, item 12: Prefect's ephemeral API is started with a start-up limit that fits a
loaded machine (not Prefect's 20 s), on the Python path too, and the wait is shown."""

from __future__ import annotations

import time

import prefect.server.api.server as server_module
from rpeg.infra import interrupts


class _SlowServer:
    """Stands in for Prefect's SubprocessASGIServer: its start takes 1.2 s."""

    started: list = []

    def __init__(self):
        self.running = False

    def start(self, timeout=None):
        _SlowServer.started.append(timeout)
        time.sleep(1.2)
        self.running = True


def _patch(monkeypatch):
    _SlowServer.started = []
    monkeypatch.setattr(server_module, "SubprocessASGIServer", _SlowServer)
    monkeypatch.setattr(interrupts, "PROGRESS_EVERY_S", 0.3)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(interrupts, "_ephemeral_allowed", lambda: True)
    from prefect.settings import PREFECT_API_URL

    monkeypatch.setattr(type(PREFECT_API_URL), "value", lambda self: None, raising=False)


def test_the_start_waits_longer_than_prefects_20_s_and_shows_the_wait(monkeypatch):
    _patch(monkeypatch)
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    lines: list[str] = []
    assert interrupts.start_ephemeral_api(log=lines.append)
    assert _SlowServer.started == [interrupts.EPHEMERAL_STARTUP_TIMEOUT_S]
    assert interrupts.EPHEMERAL_STARTUP_TIMEOUT_S > 20
    assert "waiting up to 120 s" in lines[0]
    assert any("still starting" in x for x in lines[1:-1])  # progress while it waits
    assert lines[-1].startswith("Prefect's API server ready")


def test_the_users_own_prefect_setting_is_kept(monkeypatch):
    _patch(monkeypatch)
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    lines: list[str] = []
    interrupts.start_ephemeral_api(log=lines.append)
    assert _SlowServer.started == [None]  # Prefect reads the user's 300 itself
    assert "waiting up to 300 s" in lines[0]


def test_run_train_starts_the_api_before_the_flow(monkeypatch):
    from rpeg.flows import entry, train

    from rpeg.config import RunConfig

    calls: list[str] = []
    monkeypatch.setattr(
        interrupts, "start_ephemeral_api", lambda log=None: calls.append("api") or True
    )
    monkeypatch.setattr(train, "finished_despite_api", lambda body: calls.append("flow") or {})
    entry._run_distributed(RunConfig(), None, None, False)
    assert calls == ["api", "flow"]
