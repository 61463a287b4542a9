"""Fast checks of the ops layer: parameter models, promotion rule, newest data, the
latest-good pointer, artifact helpers outside a run, the deploy CLI (dry run), infra guards."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from rpeg.flows.params import RetrainParams, TrainParams, parse_param_assignments

from rpeg.errors import ConfigError

TINY = Path(__file__).parent / "data" / "tiny.yaml"


def test_train_params_overrides_and_validation():
    p = TrainParams(
        config=str(TINY), steps=3, lr=1e-5, max_staleness=1, cluster_address="tcp://10.0.0.5:8786"
    )
    cfg = p.resolve()
    assert cfg.runtime.steps == 3 and cfg.optim.lr == 1e-5 and cfg.runtime.max_staleness == 1
    assert cfg.cluster.address == "tcp://10.0.0.5:8786"
    for bad in (
        {"steps": 0},
        {"lr": -1.0},
        {"max_staleness": -1},
        {"cluster_address": "10.0.0.5"},
        {"surprise": 1},
    ):
        with pytest.raises(ValueError):
            TrainParams(config=str(TINY), **bad)
    with pytest.raises(ConfigError, match="file not found"):
        TrainParams(config="/nope.yaml").resolve()
    with pytest.raises(ConfigError, match="workload.num_prompts"):
        TrainParams(config=str(TINY), overrides={"workload.num_prompts": 0}).resolve()


def test_schema_for_the_ui_has_types_and_ranges():
    s = TrainParams.model_json_schema()
    assert s["required"] == ["config"]
    steps = s["properties"]["steps"]["anyOf"][0]
    assert steps["type"] == "integer" and steps["minimum"] == 1
    assert s["additionalProperties"] is False


def test_retrain_params_resolve_steps_beyond_checkpoint():
    p = RetrainParams(config=str(TINY), checkpoint_url="memory://ck", steps=5)
    cfg = p.resolve(base_step=10, data_url="s3://b/new.parquet")
    assert cfg.runtime.steps == 15 and cfg.runtime.resume
    assert cfg.task.kind == "parquet" and cfg.task.url == "s3://b/new.parquet"
    with pytest.raises(ConfigError, match="checkpoint URL"):
        RetrainParams(config=str(TINY)).resolve()


def test_parse_param_assignments():
    assert parse_param_assignments(["steps=5", "lr=1e-5", "resume=true"]) == {
        "steps": 5,
        "lr": 1e-5,
        "resume": True,
    }
    with pytest.raises(ConfigError):
        parse_param_assignments(["nothing"])


def test_should_promote_rule():
    from rpeg.flows.retrain import should_promote

    assert should_promote(0.5, None)[0]
    assert should_promote(0.5, {"score": 0.5})[0]
    assert not should_promote(0.4, {"score": 0.5})[0]
    assert should_promote(0.45, {"score": 0.5}, tolerance=0.05)[0]
    assert not should_promote(float("nan"), None)[0]


def test_newest_file_by_mtime_and_name(tmp_path):
    from rpeg.flows.retrain import newest_file

    assert newest_file(str(tmp_path / "*.jsonl")) is None
    (tmp_path / "z.jsonl").write_text("{}\n")
    (tmp_path / "a.jsonl").write_text("{}\n")
    old = time.time() - 100
    os.utime(tmp_path / "z.jsonl", (old, old))
    assert newest_file(str(tmp_path / "*.jsonl")).endswith("a.jsonl")
    assert newest_file(str(tmp_path / "*.jsonl"), "name").endswith("z.jsonl")
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/ops-data/d1.jsonl", b"{}\n")
    assert (
        newest_file("memory://ops-data/*.jsonl").replace(":///", "://")
        == "memory://ops-data/d1.jsonl"
    )


def test_latest_good_pointer_and_copy(tmp_path):
    from rpeg.flows.retrain import latest_step, read_latest_good, write_latest_good

    from rpeg.runtime.actors.checkpoint import CheckpointStore

    url = str(tmp_path / "ck")
    store = CheckpointStore(url, keep_last=1)
    store.save(3, {"a.pt": b"x"})
    assert latest_step(url) == 3 and read_latest_good(url) is None
    write_latest_good(url, {"step": 3, "score": 0.5}, copy_step=3)
    assert read_latest_good(url)["score"] == 0.5
    assert (tmp_path / "ck" / "latest-good" / "COMMIT.json").exists()
    store.save(4, {"a.pt": b"y"})  # prunes step 3 (keep_last=1) ...
    assert not (tmp_path / "ck" / "step-00000003").exists()
    assert (tmp_path / "ck" / "latest-good" / "a.pt").read_bytes() == b"x"  # ... the copy stays
    assert CheckpointStore(url).complete_steps() == [4]  # the pointer files are not checkpoints


def test_artifact_helpers_are_noops_outside_a_run(tmp_path):
    from rpeg.flows import artifacts as art

    assert not art.in_prefect_run()
    assert art.publish_step(1, 2, {"reward_mean": 0.5}) is None
    assert art.publish_metrics_table([{"step": 0.0}]) is None
    assert art.publish_checkpoint(str(tmp_path), 1) is None
    assert art.publish_timeline([], tmp_path / "t.png") is None
    assert art.artifact_key("RL_Train", "Metrics") == "rl-train-metrics"
    line = art.format_step_line(
        3, 20, {"step": 2.0, "reward_mean": 0.4123, "step_s": 0.5, "zeta": 1.0}
    )
    assert line == "step 3/20 reward_mean=0.4123 step_s=0.5 zeta=1"


def test_deploy_dry_run_cli(capsys):
    from rpeg.cli import main

    rc = main(
        [
            "deploy",
            str(TINY),
            "--flow",
            "retrain",
            "--interval",
            "3600",
            "-p",
            "steps=4",
            "-p",
            "checkpoint_url=memory://x",
            "--dry-run",
        ]
    )
    assert rc == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["entrypoint"] == "flows/retrain.py:retrain" and spec["interval"] == 3600
    assert spec["parameters"]["params"] == {
        "config": str(TINY.resolve()),
        "checkpoint_url": "memory://x",
        "steps": 4,
    }
    assert main(["deploy", str(TINY), "--cron", "0 3 * * *", "--interval", "5", "--dry-run"]) == 2
    assert "give one schedule" in capsys.readouterr().err
    assert main(["deploy", str(TINY), "-p", "lr=0", "--dry-run"]) == 2


def test_prefect_yaml_deployments_match_flows():
    import yaml

    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "prefect.yaml").read_text())
    eps = {d["name"]: d["entrypoint"] for d in doc["deployments"]}
    assert (
        eps["rl-train"] == "flows/retrain.py:rpeg_train"
        and eps["retrain"] == "flows/retrain.py:retrain"
    )
    for d in doc["deployments"]:
        path, fn = d["entrypoint"].split(":")
        assert f"def {fn}(" in (root / path).read_text()
        assert d["work_pool"]["name"]


def test_server_refuses_public_address_and_builds_env():
    from rpeg.infra.prefect_server import PrefectServer, client_env, is_loopback, server_env

    with pytest.raises(ConfigError, match="non-loopback"):
        PrefectServer(host="0.0.0.0", port=4200)
    assert (
        PrefectServer(host="0.0.0.0", port=4200, expose=True).api_url == "http://0.0.0.0:4200/api"
    )
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("10.0.0.1")
    env = server_env(
        port=4300, auth_string="u:p", database_url="postgresql+asyncpg://h/db", base={}
    )
    assert (
        env["PREFECT_SERVER_API_AUTH_STRING"] == "u:p" and env["PREFECT_API_AUTH_STRING"] == "u:p"
    )
    assert (
        env["PREFECT_SERVER_API_HOST"] == "127.0.0.1"
        and env["PREFECT_API_URL"] == "http://127.0.0.1:4300/api"
    )
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert env["DO_NOT_TRACK"] == "1" and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    c = client_env("https://prefect.example/api/", auth_string="u:p", base={})
    assert (
        c["PREFECT_API_URL"] == "https://prefect.example/api"
        and c["PREFECT_API_AUTH_STRING"] == "u:p"
    )
