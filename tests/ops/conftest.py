"""Fixtures for the ops tests: one Prefect server per session on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "ops" / "data" / "tiny.yaml"


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    from rpeg.infra.prefect_server import PrefectServer

    home = tmp_path_factory.mktemp("prefect-home")
    # the scheduler loop is 60 s by default; 2 s lets the schedule test finish quickly
    srv = PrefectServer(
        home=home,
        extra_env={
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
            "PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS": "1",
            "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            # a 503 (SQLite busy) is logged with its traceback, so a failure names its cause
            "PREFECT_API_LOG_RETRYABLE_ERRORS": "true",
        },
    )
    srv.start(timeout=120)
    print(f"prefect server up in {srv.start_s:.1f}s at {srv.api_url}")
    yield srv
    srv.stop()


def _retrying_client_class():
    import httpx

    class Retrying(httpx.Client):
        def request(self, *args, **kwargs):
            for attempt in range(6):
                r = super().request(*args, **kwargs)
                if r.status_code not in (502, 503, 504):
                    return r
                time.sleep(0.5 * 2**attempt)
            return r

    return Retrying


def _Retrying(**kw):  # noqa: N802 - reads like the class it builds
    return _retrying_client_class()(**kw)


class Api:
    """A few REST calls against the test server (what a user's script or the UI does)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        # SQLite answers 503 "database is locked" when busy; Prefect's own client retries
        # those, and so does this one
        self.http = _Retrying(base_url=self.url, timeout=30)

    def deployment(self, flow: str, name: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            r = self.http.get(f"/deployments/name/{flow}/{name}")
            if r.status_code == 200:
                return r.json()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"deployment {flow}/{name} not registered: {r.status_code} {r.text[:300]}"
                )
            time.sleep(0.5)

    def create_run(self, deployment_id: str, parameters: dict | None = None):
        body = {} if parameters is None else {"parameters": parameters}
        return self.http.post(f"/deployments/{deployment_id}/create_flow_run", json=body)

    def flow_run(self, run_id: str) -> dict:
        return self.http.get(f"/flow_runs/{run_id}").json()

    def wait(self, run_id: str, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            fr = self.flow_run(run_id)
            st = (fr.get("state") or {}).get("type")
            if st in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                return fr
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {run_id} still {st} after {timeout}s")
            time.sleep(0.5)

    def runs_of(self, deployment_id: str) -> list[dict]:
        r = self.http.post(
            "/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}}
        )
        return r.json()

    def artifacts(self, run_id: str) -> list[dict]:
        r = self.http.post(
            "/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}
        )
        r.raise_for_status()
        return r.json()

    def wait_logs(self, run_id: str, *needles: str, timeout: float = 20.0) -> str:
        """The run's logs once they contain every needle (logs land in batches, after the
        state may already be final); returns what arrived either way."""
        deadline = time.monotonic() + timeout
        while True:
            text = "\n".join(self.logs(run_id))
            if all(n in text for n in needles) or time.monotonic() > deadline:
                return text
            time.sleep(0.5)

    def logs(self, run_id: str) -> list[str]:
        r = self.http.post(
            "/logs/filter",
            json={
                "logs": {"flow_run_id": {"any_": [run_id]}},
                "limit": 200,
                "sort": "TIMESTAMP_ASC",
            },
        )
        return [x["message"] for x in r.json()]


@pytest.fixture(scope="session")
def api(prefect_server):
    return Api(prefect_server.api_url)


@pytest.fixture(scope="session")
def served(prefect_server, tmp_path_factory):
    """A ``serve`` subprocess (one runner, polling every second) with the ci deployments."""
    from rpeg.infra.prefect_server import stop_process

    work = tmp_path_factory.mktemp("ops-served")
    data = work / "data"
    data.mkdir()
    (data / "a-old.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n' * 4)
    time.sleep(0.05)
    rows = "".join(
        f'{{"question": "{a}+{b}=", "answer": "{a + b}"}}\n' for a in range(6) for b in range(6)
    )
    (data / "b-new.jsonl").write_text(rows)
    env = prefect_server.client_env()
    env["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
    env["PREFECT_LOGGING_LEVEL"] = "INFO"
    log = open(work / "serve.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "tests/ops/ops_flows.py",
            "serve",
            "--config",
            str(TINY),
            "--checkpoint-url",
            str(work / "ckpt"),
            "--data-glob",
            str(data / "*.jsonl"),
            "--output-dir",
            str(work / "out"),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    info = {"proc": proc, "work": work, "log": work / "serve.log", "t0": time.perf_counter()}
    yield info
    stop_process(proc)
    log.close()
    os.environ.get("RPEG_KEEP_OPS_LOGS") and print((work / "serve.log").read_text()[-5000:])
