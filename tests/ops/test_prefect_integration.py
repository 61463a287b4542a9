"""Integration: a real Prefect server on a free loopback port, deployments served by a
runner subprocess, runs triggered through the REST API with parameters.

Budget on the 2-core CI machine: server ~10-16 s (fresh DB), retrain rounds ~20 s each,
refusal ~5 s, schedule ~10 s. The training flow on Dask actors runs in the browser test
(tests/ops/test_ui_browser.py), started from the form.
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow


def _by_key(artifacts: list[dict]) -> dict[str, dict]:
    """The newest version per key."""
    out: dict[str, dict] = {}
    for a in sorted(artifacts, key=lambda a: a["created"]):
        if a.get("key"):
            out[a["key"]] = a
    return out


def test_retrain_deployment_triggered_through_api(api, served):
    dep = api.deployment("retrain", "ci-retrain", timeout=90)
    register_s = time.perf_counter() - served["t0"]
    assert dep["global_concurrency_limit"]["limit"] == 1  # prefect.yaml's limit, when serving
    # invalid values are refused by the server (schema) before any run or actor exists
    bad = api.create_run(dep["id"], {"steps": 0})
    assert bad.status_code in (409, 422), bad.text
    assert "steps" in bad.text
    bad = api.create_run(dep["id"], {"cluster_address": "not an address"})
    assert bad.status_code in (409, 422), bad.text

    t0 = time.perf_counter()
    r = api.create_run(dep["id"], {"lr": 5e-5})  # one field: the others are the deployment's
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    assert r.json()["parameters"]["data_glob"] == dep["parameters"]["data_glob"]
    fr = api.wait(run_id, timeout=150)
    took = time.perf_counter() - t0
    print(f"deployment registered after {register_s:.1f}s; trigger -> finished {took:.1f}s")
    assert fr["state"]["type"] == "COMPLETED", served["log"].read_text()[-4000:]
    assert fr["parameters"]["lr"] == 5e-5 and fr["parameters"]["steps"] == 2
    assert fr["name"].startswith("tiny-retrain-2-steps-"), fr["name"]

    arts = _by_key(api.artifacts(run_id))
    assert {
        "retrain-progress",
        "retrain-metrics",
        "retrain-plan",
        "retrain-summary",
        "retrain-decision",
        "retrain-latest-good",
    } <= set(arts), sorted(arts)
    assert float(arts["retrain-progress"]["data"]) == pytest.approx(100.0)
    table = arts["retrain-metrics"]["data"]
    rows = json.loads(table) if isinstance(table, str) else table
    assert [row["step"] for row in rows] == [1, 2]
    summary = arts["retrain-summary"]["data"]
    assert summary.count("](data:image/png;base64,") >= 2  # the curve and the Gantt chart
    assert "file://" not in summary and "file://" not in arts["retrain-latest-good"]["data"]
    assert "promoted" in arts["retrain-decision"]["data"]
    # the latest-good artifact names the copy that pruning never deletes
    ckpt = served["work"] / "ckpt"
    assert f"`{ckpt / 'latest-good'}`" in arts["retrain-latest-good"]["data"]
    logs = api.wait_logs(run_id, "step 2/2 reward_mean=", "b-new.jsonl")
    assert logs.count("step 2/2 reward_mean=") == 1  # one line per step
    assert "b-new.jsonl" in logs  # the newest file under the glob was used

    assert (ckpt / "retrain" / "step-00000002" / "COMMIT.json").exists()  # run id retrain
    good = json.loads((ckpt / "latest-good.json").read_text())
    assert good["step"] == 2 and good["data"].endswith("b-new.jsonl")
    assert (ckpt / "latest-good" / "COMMIT.json").exists()
    # the run wrote to its own folder, named after the run; `latest` points at it
    out = served["work"] / "out"
    assert (out / fr["name"] / "metrics.jsonl").exists()
    assert (out / "latest").resolve() == (out / fr["name"]).resolve()
    served["run_id"] = run_id

    # a second round resumes from step 2 and trains 2 more steps
    r = api.create_run(dep["id"], {"tolerance": 1.0})
    fr = api.wait(r.json()["id"], timeout=150)
    assert fr["state"]["type"] == "COMPLETED", served["log"].read_text()[-4000:]
    assert (ckpt / "retrain" / "step-00000004" / "COMMIT.json").exists()
    good = json.loads((ckpt / "latest-good.json").read_text())
    assert good["step"] == 4 and good["previous"]["step"] == 2


def test_bad_parameters_are_refused_in_the_run_when_client_validation_is_off(api, served):
    """The UI's "Validate parameters" switch off: the server takes steps=-1, the flow
    refuses it with one ERROR line, a refused artifact and a Failed state saying why."""
    dep = api.deployment("retrain", "ci-retrain", timeout=90)
    r = api.http.post(
        f"/deployments/{dep['id']}/create_flow_run",
        json={"parameters": {"steps": -1}, "enforce_parameter_schema": False},
    )
    assert r.status_code == 201, r.text
    fr = api.wait(r.json()["id"], timeout=120)
    assert fr["state"]["type"] == "FAILED"
    msg = fr["state"]["message"]
    assert (
        msg
        == "parameters refused: Steps (beyond the latest checkpoint) (steps): must be at least 1 (got -1)"
    )
    api.wait_logs(fr["id"], msg, "Finished in state Failed")
    logs = api.logs(fr["id"])
    assert logs.count(msg) == 1  # the body's one ERROR line
    # no traceback through RPEG's code (Prefect's engine adds its own FailedRun line to
    # every failed deployment run; that one is not ours to remove)
    assert not any('File "' in m and "/flows/" in m for m in logs), logs
    arts = _by_key(api.artifacts(fr["id"]))
    assert msg in arts["retrain-refused"]["data"]
    assert set(arts) == {"retrain-refused"}  # nothing else started


def test_schedule_fires_and_status_tells_who_serves(api, served, prefect_server):
    from rpeg.flows.deployments import status_rows

    dep = api.deployment("ops-heartbeat", "ci-heartbeat", timeout=90)
    assert not api.runs_of(dep["id"])  # served without a schedule: nothing yet
    rows = {r["deployment"]: r for r in status_rows(prefect_server.api_url)}
    assert rows["retrain/ci-retrain"]["served"].startswith("served (last poll")
    assert rows["train/ci-train"]["concurrency_limit"] == 1
    t0 = time.perf_counter()
    r = api.http.post(
        f"/deployments/{dep['id']}/schedules",
        json=[{"schedule": {"interval": 3, "timezone": "Europe/Zurich"}, "active": True}],
    )
    r.raise_for_status()
    sched_id = r.json()[0]["id"]
    deadline = time.monotonic() + 90
    done = runs = []
    try:
        while time.monotonic() < deadline:
            runs = api.runs_of(dep["id"])
            done = [
                r for r in runs if r["state"]["type"] == "COMPLETED" and r.get("auto_scheduled")
            ]
            if done:
                break
            time.sleep(1.0)
    finally:  # deleting the schedule deletes its future runs
        api.http.delete(f"/deployments/{dep['id']}/schedules/{sched_id}").raise_for_status()
    print(f"schedule created -> first scheduled run completed: {time.perf_counter() - t0:.1f}s")
    assert done, (
        f"no scheduled run completed; runs: {[(r['name'], r['state']['type']) for r in runs]}"
    )
    arts = _by_key(api.artifacts(done[0]["id"]))
    assert float(arts["ops-heartbeat-progress"]["data"]) == pytest.approx(100.0)
