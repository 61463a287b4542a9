"""Fast checks of the ops layer's services: the deploy CLI (dry run), schedules' time zones,
deployment status, prefect.yaml against the flows, server auth and secrets, the results page,
run names, and artifact calls while the Prefect API does not answer."""

import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rpeg.flows.params import (
    form_defaults,
)

from rpeg.errors import ConfigError

TINY = Path(__file__).parent / "data" / "tiny.yaml"
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- deployments
def test_deploy_dry_run_cli(capsys):
    from rpeg.cli import main

    rc = main(
        [
            "deploy",
            str(TINY),
            "--flow",
            "retrain",
            "--cron",
            "0 3 * * *",
            "--timezone",
            "Europe/Zurich",
            "-p",
            "steps=4",
            "-p",
            "checkpoint_url=memory://x",
            "--dry-run",
        ]
    )
    assert rc == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["entrypoint"] == "flows/retrain.py:retrain" and spec["name"] == "tiny"
    assert (spec["cron"], spec["timezone"]) == ("0 3 * * *", "Europe/Zurich")
    assert spec["concurrency_limit"] == 1  # prefect.yaml's retrain entry
    p = spec["parameters"]
    assert (p["config"], p["checkpoint_url"], p["steps"]) == (str(TINY.resolve()), "memory://x", 4)
    assert "num_prompts" not in p  # not a retrain field
    assert main(["deploy", str(TINY), "--cron", "0 3 * * *", "--interval", "5", "--dry-run"]) == 2
    assert "give one schedule" in capsys.readouterr().err
    assert main(["deploy", str(TINY), "-p", "lr=0", "--timezone", "Mars/Base", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "Mars/Base" in err and "Learning rate (lr): must be more than 0.0" in err


def test_schedules_carry_the_time_zone():
    from rpeg.flows.deployments import schedules_of

    (c,) = schedules_of({"cron": "0 3 * * *", "timezone": "Europe/Zurich"})
    assert (c.cron, c.timezone) == ("0 3 * * *", "Europe/Zurich")
    (i,) = schedules_of({"interval": 3600, "timezone": "UTC"})
    assert i.interval == timedelta(hours=1)
    assert schedules_of({}) == []


def test_status_tells_when_nothing_serves_a_deployment():
    from rpeg.flows.deployments import SERVED_WITHIN_S, status_row

    now = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    dep = {
        "name": "tiny",
        "paused": False,
        "status": "READY",
        "last_polled": (now - timedelta(seconds=5)).isoformat(),
        "schedules": [
            {"schedule": {"cron": "0 3 * * *", "timezone": "Europe/Zurich"}, "active": False}
        ],
        "global_concurrency_limit": {"limit": 1},
    }
    row = status_row(dep, "retrain", now)
    assert row["deployment"] == "retrain/tiny" and row["served"] == "served (last poll 5 s ago)"
    assert row["schedules"] == "0 3 * * * Europe/Zurich (off)" and row["concurrency_limit"] == 1
    stale = dict(dep, last_polled=(now - timedelta(seconds=SERVED_WITHIN_S + 60)).isoformat())
    assert status_row(stale, "retrain", now)["served"].startswith("NOT SERVED (last poll 120 s")
    assert status_row(stale, "retrain", now)["prefect_status"] == "READY"  # Prefect still says so
    assert (
        status_row(dict(dep, last_polled=None), "r", now)["served"] == "NOT SERVED (never polled)"
    )
    assert status_row(dict(dep, paused=True), "r", now)["served"] == "paused"


def test_prefect_yaml_deployments_match_flows_and_config():
    """Every form field prefect.yaml does not list takes the flow's default: that default
    must equal the deployment config's own value, or the config would be overridden."""
    import yaml
    from rpeg.flows.deployments import JOBS, prefect_yaml_settings

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    by_ep = {j.entrypoint: j for j in JOBS.values()}
    assert {d["entrypoint"] for d in doc["deployments"]} == set(by_ep)
    for d in doc["deployments"]:
        job = by_ep[d["entrypoint"]]
        path, fn = d["entrypoint"].split(":")
        assert f"def {fn}(" in (ROOT / path).read_text()
        assert d["work_pool"]["name"] and d["concurrency_limit"] == 1
        params = d["parameters"]
        job.params.model_validate(params)  # valid form values
        from_cfg = form_defaults(job.params, str(ROOT / params["config"]))
        defaults = job.params().model_dump(mode="json")
        for k in ("lr", "max_staleness", "num_prompts", "samples_per_prompt"):
            if k in job.params.model_fields and k not in params:
                assert defaults[k] == from_cfg[k], f"{d['name']}: list {k} in prefect.yaml"
        tz = [s.get("timezone") for s in d.get("schedules") or []]
        assert all(tz), "schedules name their time zone"
    assert prefect_yaml_settings("retrain")["schedules"][0]["cron"] == "0 3 * * *"


# ---------------------------------------------------------------------- server and secrets
def test_server_refuses_public_address_without_auth_and_builds_env():
    from rpeg.infra.prefect_server import PrefectServer, client_env, is_loopback, server_env

    with pytest.raises(ConfigError, match="non-loopback"):
        PrefectServer(host="0.0.0.0", port=4200)
    with pytest.raises(ConfigError, match="needs basic auth"):
        PrefectServer(host="0.0.0.0", port=4200, expose=True)
    srv = PrefectServer(host="0.0.0.0", port=4200, expose=True, auth_string="u:secret-pw")
    assert srv.api_url == "http://0.0.0.0:4200/api"
    assert "secret-pw" not in repr(srv) and "secret-pw" not in " ".join(srv.command())
    assert srv.env()["PREFECT_SERVER_API_AUTH_STRING"] == "u:secret-pw"  # the environment only
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


def test_auth_secret_comes_from_env_or_private_file(tmp_path, monkeypatch):
    from rpeg.infra.prefect_server import export_lines, mask_auth, read_auth

    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    assert read_auth() is None
    monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", "admin:hunter2")
    assert read_auth() == "admin:hunter2" and mask_auth("admin:hunter2") == "admin:***"
    f = tmp_path / "auth"
    f.write_text("ops:s3cret\n")
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as e:
        read_auth(f)
    assert "s3cret" not in str(e.value)
    f.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert read_auth(f) == "ops:s3cret"
    f.write_text("no-colon\n")
    with pytest.raises(ConfigError, match="expected user:password") as e:
        read_auth(f)
    assert "no-colon" not in str(e.value)
    out = export_lines(
        {"PREFECT_API_URL": "http://h/api", "PREFECT_API_AUTH_STRING": "admin:hunter2"},
        auth_file=f,
    )
    assert "hunter2" not in out and f'"$(head -n1 {f})"' in out and "admin:***" in out


def test_server_cli_never_echoes_a_password(capsys, monkeypatch):
    from rpeg.cli import main

    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    assert main(["server", "start", "--auth", "admin:hunter2"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "does not belong on the command line" in err
    assert main(["server", "start", "--auth"]) == 2
    assert "PREFECT_SERVER_API_AUTH_STRING" in capsys.readouterr().err
    assert main(["server", "start", "--host", "0.0.0.0", "--expose"]) == 2
    assert "needs basic auth" in capsys.readouterr().err
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "admin:hunter2")
    assert main(["server", "env", "--api-url", "http://10.0.0.2:4200/api"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "export PREFECT_API_URL=http://10.0.0.2:4200/api" in out


def test_results_page_embeds_both_pictures_and_saves_them(tmp_path):
    from rpeg.flows.artifacts import results_markdown

    from rpeg.perf.timeline import TimelineRecord

    hist = [{"step": i + 1, "reward_mean": 0.2 * i, "accuracy": 0.1 * i} for i in range(3)]
    pred = [
        TimelineRecord("generate", "0-1", 0.0, 1.0),
        TimelineRecord("train_actor", "0-1", 1.0, 3.0),
    ]
    meas = [TimelineRecord("generate", "0-1", 0.0, 1.5, source="measured")]
    md = results_markdown(
        {"steps": 3, "heldout_acc_before": 0.1, "heldout_acc_after": 0.5},
        hist,
        measured=meas,
        predicted=pred,
        out_dir=tmp_path,
    )
    assert md.count("](data:image/png;base64,") == 2
    assert (
        md.index("## Reward and accuracy") < md.index("## Step timeline") < md.index("## Numbers")
    )
    for name in ("reward_curve.png", "timeline.png"):  # the names --local uses too
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
        assert f"`{tmp_path / name}`" in md
    assert "| train_actor | 2 |" in md and "| generate | 1.5 |" in md  # seconds per stage
    assert "held-out accuracy: 0.1 before, 0.5 after training" in md
    assert "file://" not in md


def test_run_names_read_like_the_job(monkeypatch):
    from rpeg.flows import launch

    params = {"config": "/srv/cfg/my-run.yaml", "steps": 20}
    monkeypatch.setattr(launch, "_param", lambda name, default="": params.get(name, default))
    monkeypatch.setattr(launch, "short_id", lambda: "3fa2c1")
    assert launch.train_run_name() == "my-run-20-steps-3fa2c1"
    assert launch.retrain_run_name() == "my-run-retrain-20-steps-3fa2c1"
    params = {"config": {"model": {"name": "rpeg-tiny"}, "runtime": {"steps": 5}}}
    assert launch.config_run_name() == "rpeg-tiny-5-steps-3fa2c1"
    params = {"config": ""}
    assert launch.train_run_name() == "builtin-?-steps-3fa2c1"

    def broken(name, default=""):
        raise RuntimeError("no context")

    monkeypatch.setattr(launch, "_param", broken)
    assert launch.train_run_name() == "train-3fa2c1"  # a name never fails the run


# ---------------------------------------------------------------------- a lost Prefect API
def test_artifact_calls_try_once_and_pause_while_the_api_does_not_answer(monkeypatch, caplog):
    """With the client's 5 retries each step's artifact waited ~73 s on a dead API (the
    last metrics line came ~50 min after training ended); now one retry, then a pause."""
    import httpx
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES
    from rpeg.flows import api_calls as art

    monkeypatch.setattr(art, "_API_DOWN", {})
    calls = []

    def dead(**kw):
        calls.append(PREFECT_CLIENT_MAX_RETRIES.value())
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with caplog.at_level("WARNING", logger="rpeg.flows.artifacts"):
        assert art.api_call("progress", dead, progress=1.0) is None
        assert art.api_call("progress", dead, progress=2.0) is None  # paused: not even tried
    assert calls == [art.API_RETRIES]  # the client's retries cut to one
    assert sum("does not answer" in r.getMessage() for r in caplog.records) == 1
    # the pause ends: tried again, and an answering API resumes the calls
    for url in art._API_DOWN:
        art._API_DOWN[url] = 0.0
    assert art.api_call("progress", lambda **kw: "id-1", progress=3.0) == "id-1"
    assert not art._API_DOWN and "answers again" in caplog.records[-1].getMessage()
    # an error that is an answer (not a lost connection) is logged, never pauses
    assert art.api_call("markdown", lambda **kw: 1 / 0) is None and not art._API_DOWN


def test_a_run_that_finished_is_not_failed_by_the_api_dying_at_its_end():
    """The flow body returned (outputs written), then Prefect could not record the final
    state: run_train returns the summary; an error before the body returned still raises."""
    import httpx
    from rpeg.flows import train as ft

    def finished_then_api_lost():
        ft._body_finished({"steps": 3})  # what rl_train's body does when it returns
        raise httpx.ConnectError("[Errno 111] Connection refused")

    assert ft.finished_despite_api(finished_then_api_lost) == {"steps": 3}
    assert ft._BODY_DONE.get() is None  # nothing kept after the call

    def lost_mid_run():
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with pytest.raises(httpx.ConnectError):
        ft.finished_despite_api(lost_mid_run)

    def other_error():
        ft._body_finished({"steps": 3})
        raise ValueError("not the API")

    with pytest.raises(ValueError):
        ft.finished_despite_api(other_error)
    assert ft._BODY_DONE.get() is None
