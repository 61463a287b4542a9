"""A real browser (headless Chromium driven by Playwright) against the test's own Prefect
server on 127.0.0.1: open the training deployment's run form, fill it, start the run by
clicking Submit, and check that the run's summary artifact shows its pictures.

This runs the training flow end to end on a Dask LocalCluster (~40-60 s on 2 cores).
``RPEG_UPDATE_DOC_IMAGES=1`` also refreshes the screenshots in docs/img/ (docs/operating.md).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from rpeg.infra.ui_screenshot import missing

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
]

REPO = Path(__file__).resolve().parents[2]
DOC_IMG = REPO / "docs" / "img"


def _field(page, title: str):
    """The input of the form field titled ``title`` (the UI appends " (Optional)")."""
    label = page.locator(
        ".schema-form-property__label",
        has_text=re.compile(rf"^{re.escape(title)}( \(Optional\))?$"),
    )
    return page.locator(".schema-form-property").filter(has=label).first.locator("input").first


def _shot(page, name: str, tmp_path: Path, **kw) -> Path:
    target = DOC_IMG if os.environ.get("RPEG_UPDATE_DOC_IMAGES") == "1" else tmp_path
    path = target / name
    page.screenshot(path=str(path), **kw)
    return path


def _new_run(api, dep_id: str, known: set[str], page, tmp_path: Path, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [r for r in api.runs_of(dep_id) if r["id"] not in known]
        if new:
            return new[0]
        time.sleep(0.5)
    page.screenshot(path=str(tmp_path / "after-submit.png"), full_page=True)
    raise AssertionError(
        f"clicking Submit created no flow run in {timeout:.0f} s; the page: "
        f"{tmp_path / 'after-submit.png'}; its text ends {page.inner_text('body')[-600:]!r}"
    )


def _is_create(response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/create_flow_run")


def _submit(page, server, attempts: int = 3):
    """Click Submit and return the server's answer to the UI's create-flow-run request.

    A busy SQLite server answers 503 ("database is locked": a read transaction that must
    upgrade to a write while another connection writes fails at once, whatever the busy
    timeout). Prefect's own client retries those; its UI shows "Oops. Something went wrong."
    (on any 5xx of any request, e.g. the parameter validation before the create) and the user
    clicks Submit again, so the test does too, at most ``attempts`` times. A 4xx, or the same
    failure every time, fails the test with every failed API answer and the server's log."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    failed: list[str] = []

    def note(response) -> None:
        if "/api/" in response.url and response.status >= 400:
            failed.append(f"{response.request.method} {response.url} -> {response.status}")

    page.on("response", note)
    tries = []
    for attempt in range(attempts):
        submit = page.get_by_role("button", name="Submit")
        submit.wait_for(timeout=30_000)
        try:
            with page.expect_response(_is_create, timeout=45_000) as info:
                submit.click()
        except PlaywrightTimeout:  # the UI sent no create request (a failed validation call)
            tries.append("no create_flow_run request in 45 s")
        else:
            resp = info.value
            if resp.ok:
                page.remove_listener("response", note)
                return resp
            tries.append(f"{resp.status} {resp.text()[:300]}")
            if resp.status < 500:
                break
        time.sleep(1.0 + attempt)
    raise AssertionError(
        f"Submit did not create a flow run: {tries}; failed API answers: {failed}; "
        f"server log:\n{server.log_tail(3000)}"
    )


def test_run_from_the_form_shows_pictures(api, served, prefect_server, tmp_path):
    from rpeg.infra.ui_screenshot import browser

    ui = prefect_server.ui_url
    dep = api.deployment("train", "ci-train", timeout=90)
    known = {r["id"] for r in api.runs_of(dep["id"])}
    with browser() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{ui}/deployments/deployment/{dep['id']}/run")
        steps = _field(page, "Steps")
        steps.wait_for(timeout=60_000)
        assert steps.input_value() == "2"  # the deployment's default, from the form
        steps.fill("3")
        _field(page, "Learning rate").fill("0.0002")
        _shot(page, "prefect-run-form.png", tmp_path)
        t0 = time.perf_counter()
        _submit(page, prefect_server)
        run = _new_run(api, dep["id"], known, page, tmp_path)
        assert (run["parameters"]["steps"], run["parameters"]["lr"]) == (3, 0.0002)
        # the deployment's other defaults stay (parameters merge)
        assert run["parameters"]["num_prompts"] == 4 and run["parameters"]["config"].endswith(
            "tiny.yaml"
        )
        fr = api.wait(run["id"], timeout=400)
        print(f"form submit -> train run finished: {time.perf_counter() - t0:.1f}s")
        assert fr["state"]["type"] == "COMPLETED", served["log"].read_text()[-6000:]
        assert fr["name"].startswith("tiny-3-steps-"), fr["name"]

        page.goto(f"{ui}/runs/flow-run/{run['id']}")
        page.get_by_text(fr["name"]).first.wait_for(timeout=60_000)
        page.get_by_text("actors ready (models loaded").first.wait_for(timeout=60_000)  # start-up
        _shot(page, "prefect-flow-run.png", tmp_path)
        page.get_by_text("Artifacts", exact=True).first.click()
        card = page.get_by_text("train-summary", exact=True).first
        card.wait_for(timeout=60_000)
        for key in ("train-plan", "train-metrics", "train-progress", "train-checkpoint"):
            assert page.get_by_text(key, exact=True).count() == 1, key  # published once
        card.click()
        page.wait_for_url(re.compile(r".*/artifacts/artifact/"), timeout=60_000)
        imgs = page.locator("img[src^='data:image/png;base64,']")
        imgs.first.wait_for(timeout=60_000)
        assert imgs.count() == 2  # the reward/accuracy curve and the Gantt chart
        for i in range(2):
            img = imgs.nth(i)
            img.scroll_into_view_if_needed()
            width = img.evaluate("el => el.complete ? el.naturalWidth : 0")
            assert width >= 600, f"image {i} did not render (naturalWidth {width})"
        assert page.get_by_text("file://").count() == 0
        _shot(page, "prefect-run-artifacts.png", tmp_path, full_page=True)


def test_retrain_schedule_in_the_ui(api, served, prefect_server, tmp_path):
    """The retrain deployment with a cron schedule in a time zone, as the UI shows it."""
    from rpeg.infra.ui_screenshot import browser

    dep = api.deployment("retrain", "ci-retrain", timeout=90)
    r = api.http.post(
        f"/deployments/{dep['id']}/schedules",
        json=[{"schedule": {"cron": "0 3 * * *", "timezone": "Europe/Zurich"}, "active": False}],
    )
    r.raise_for_status()
    sched_id = r.json()[0]["id"]
    try:
        with browser() as b:
            page = b.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{prefect_server.ui_url}/deployments/deployment/{dep['id']}")
            page.get_by_text("At 03:00 AM every day").first.wait_for(timeout=60_000)
            page.locator(".p-icon-button-menu button").last.click()  # the schedule's menu
            page.get_by_text("Edit", exact=True).first.click()
            page.get_by_text("Europe / Zurich").first.wait_for(timeout=30_000)
            page.wait_for_timeout(500)
            _shot(page, "prefect-retrain-schedule.png", tmp_path)
    finally:
        api.http.delete(f"/deployments/{dep['id']}/schedules/{sched_id}").raise_for_status()
