"""``runtime.loggers``: where per-step metrics go besides metrics.jsonl, one module used by
both runtimes (rpeg.runtime.loggers), checked before anything starts."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime import loggers as L

STEPS = [{"step": s, "reward_mean": 0.25 * s, "accuracy": 0.5, "flag": True} for s in (1, 2, 3)]


def _scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(folder))
    ev.Reload()
    return [(e.step, e.value) for e in ev.Scalars(tag)]


def test_unknown_logger_is_refused_naming_the_allowed_values():
    with pytest.raises(ConfigError) as exc:
        RunConfig().with_overrides({"runtime.loggers": ["tensorboard", "wandbb"]})
    msg = str(exc.value)
    assert "runtime.loggers" in msg and "'wandbb'" in msg
    assert all(n in msg for n in ("'tensorboard'", "'wandb'", "'mlflow'"))


def test_named_logger_not_installed_is_refused_before_start(monkeypatch, tmp_path):
    """Runs whether or not wandb is installed here: the check is what the preflight sees."""
    from rpeg.preflight import preflight

    real = L._installed
    monkeypatch.setattr(L, "_installed", lambda m: m not in ("wandb", "mlflow") and real(m))
    cfg = RunConfig().with_overrides(
        {"runtime.loggers": ["wandb", "mlflow"], "runtime.output_dir": str(tmp_path / "o")}
    )
    with pytest.raises(ConfigError) as exc:
        preflight(cfg, local=True)
    msg = str(exc.value)
    assert "`pip install wandb`" in msg and "`pip install mlflow`" in msg
    assert "runtime.loggers" in msg
    assert not (tmp_path / "o").exists()  # nothing started
    # the default (unset) names only what is installed, and is never refused
    assert L.logger_problems(RunConfig()) == []


def test_default_is_tensorboard_and_an_empty_list_writes_nothing(tmp_path):
    pytest.importorskip("tensorboard")
    assert L.logger_names(RunConfig()) == ("tensorboard",)
    none = L.RunLoggers(tmp_path / "a", RunConfig().with_overrides({"runtime.loggers": []}))
    none.add(1, STEPS[0])
    none.close()
    assert not (tmp_path / "a" / L.TB_DIR).exists()


def test_tensorboard_from_both_runtimes_writers_at_the_console_step(tmp_path):
    """The local trainer uses RunLoggers directly; the distributed flow's metrics sink
    (flows.step_sink._Metrics) with its 0-based step index -> the console's count."""
    pytest.importorskip("tensorboard")
    from rpeg.flows.step_sink import _Metrics

    cfg = RunConfig().with_overrides({"runtime.loggers": ["tensorboard"]})
    local = L.RunLoggers(tmp_path / "local", cfg)
    for m in STEPS:
        local.add(m["step"], m)
    local.close()
    dist = _Metrics(tmp_path / "dist", cfg)
    for i, m in enumerate(STEPS):
        dist.scalar(i, m)  # the scheduler's 0-based index
    dist.close()
    for run in ("local", "dist"):
        got = _scalars(tmp_path / run / L.TB_DIR, "reward_mean")
        assert got == [(1, 0.25), (2, 0.5), (3, 0.75)]
        assert _scalars(tmp_path / run / L.TB_DIR, "accuracy")[0] == (1, 0.5)


def test_mlflow_local_store_under_the_output_dir(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    lg = L.RunLoggers(tmp_path, RunConfig().with_overrides({"runtime.loggers": ["mlflow"]}))
    for m in STEPS:
        lg.add(m["step"], m)
    lg.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / L.MLFLOW_DB}")
    hist = client.get_metric_history(lg.loggers[0].run_id, "reward_mean")
    assert [(h.step, h.value) for h in hist] == [(1, 0.25), (2, 0.5), (3, 0.75)]


def test_wandb_offline_run_under_the_output_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    lg = L.RunLoggers(tmp_path, RunConfig().with_overrides({"runtime.loggers": ["wandb"]}))
    for m in STEPS:
        lg.add(m["step"], m)
    lg.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))
