"""One preparation path (issue 41, item 2): a deployed ``train`` run derives from the data
what ``rpeg train`` derives (workload.max_prompt_tokens from the prompts as the model gets
them), in its own run folder; a refused one is a named error and a markdown artifact,
before any Dask cluster starts."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from tests.firstday.conftest import run_yaml


@pytest.fixture
def flow_body(monkeypatch):
    """The deployed ``train`` flow's body with the cluster, the training and the artifacts
    replaced by recorders (what is tested is what happens before them)."""
    from rpeg.flows import entry, train_form
    from rpeg.infra import cluster

    seen: dict = {"refused": [], "trained": []}

    def no_cluster(*a, **k):
        raise AssertionError("a Dask cluster started")

    monkeypatch.setattr(cluster, "start_cluster", no_cluster)
    monkeypatch.setattr(
        entry, "_run_distributed", lambda cfg, *a: seen["trained"].append(cfg) or {}
    )
    monkeypatch.setattr(train_form.reports, "plan_report", lambda cfg: ("", None))
    monkeypatch.setattr(train_form.art, "publish_plan_report", lambda md: None)
    monkeypatch.setattr(train_form.art, "publish_results", lambda *a, **k: None)
    monkeypatch.setattr(train_form.launch.art, "publish_refused", seen["refused"].append)
    return train_form.train.fn, seen


def test_a_deployed_run_derives_max_prompt_tokens_as_rpeg_train(user_files, tmp_path, flow_body):
    from rpeg.runtime.datasets.fit import fit_prompt_lengths

    body, seen = flow_body
    path = run_yaml(user_files, tmp_path)
    default = RunConfig().workload.max_prompt_tokens
    cli = fit_prompt_lengths(RunConfig.from_yaml(path))  # what `rpeg train` derives
    assert cli.workload.max_prompt_tokens > default  # (the issue: 360 prompts filtered out)
    body(steps=1, config=path)
    assert seen["refused"] == []
    (cfg,) = seen["trained"]
    assert cfg.workload.max_prompt_tokens == cli.workload.max_prompt_tokens
    folder = tmp_path / "out" / cfg.runtime.run_id  # its own run folder, its config.yaml
    assert cfg.runtime.output_dir == str(folder)
    saved = RunConfig.from_yaml(str(folder / "config.yaml"))
    assert saved.workload.max_prompt_tokens == cli.workload.max_prompt_tokens


def test_a_refused_deployed_run_is_a_named_error_and_an_artifact(user_files, tmp_path, flow_body):
    body, seen = flow_body
    path = run_yaml(
        user_files,
        tmp_path,
        workload={"max_prompt_tokens": 4},
        task={"overlong": "error"},
    )
    state = body(steps=1, config=path)
    assert state.is_failed() and seen["trained"] == []
    (line,) = seen["refused"]
    assert "\n" not in line and "workload.max_prompt_tokens" in line
    assert state.message == line


@pytest.mark.parametrize("engine", ["dask", "local"])
def test_a_retrain_round_derives_max_prompt_tokens_too(user_files, tmp_path, monkeypatch, engine):
    """The retrain deployment on newest data: the same derivation before its training task."""
    from rpeg.flows import retrain as R

    from rpeg.runtime.datasets.fit import fit_prompt_lengths

    got: list[dict] = []

    class Recorder:  # the training task: records what it was given
        def with_options(self, **kw):
            return self

        def __call__(self, config_json, engine):
            got.append(config_json)
            return {"steps": 1}

    monkeypatch.setattr(R, "train_task", Recorder())
    monkeypatch.setattr(
        R, "find_latest_checkpoint", lambda at, url: {"step": 0, "latest_good": None}
    )
    monkeypatch.setattr(R.reports, "plan_report", lambda cfg: ("", None))
    monkeypatch.setattr(R.art, "publish_plan_report", lambda md: None)
    monkeypatch.setattr(R.art, "publish_results", lambda *a, **k: None)
    monkeypatch.setattr(R, "_decide", lambda *a: {"decided": True})
    path = run_yaml(user_files, tmp_path)
    out = R.retrain.fn(config=path, checkpoint_url=str(tmp_path / "ck"), engine=engine, steps=1)
    assert out == {"decided": True}
    (cfg,) = [RunConfig.from_dict(c) for c in got]
    want = fit_prompt_lengths(RunConfig.from_yaml(path)).workload.max_prompt_tokens
    assert want > RunConfig().workload.max_prompt_tokens
    assert cfg.workload.max_prompt_tokens == want


@pytest.mark.slow
def test_a_deployed_verl_run_trains_as_rpeg_train_does(user_files, tmp_path):
    """The issue's failure: the deployed flow on a verl parquet filtered out every prompt
    (max_prompt_tokens 32) after its cluster started. Now it trains, with the first step's
    reward of ``run_train`` on the same config."""
    from rpeg.flows.entry import train as run_train
    from rpeg.flows.train_form import train

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    deployed = train(steps=1, config=run_yaml(user_files, tmp_path / "a"))
    assert isinstance(deployed, dict), deployed  # a Failed state otherwise
    cfg = RunConfig.from_yaml(run_yaml(user_files, tmp_path / "b")).with_overrides(
        {"runtime.steps": 1}
    )
    direct = run_train(cfg, progress=False)
    assert deployed["steps"] == direct["steps"] == 1
    assert deployed["reward_first10"] == direct["reward_first10"]
