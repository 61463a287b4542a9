"""Screenshot a Prefect UI page with headless Chromium over the DevTools protocol.

    python infra/ui_screenshot.py URL OUT.png [--wait-text TEXT] [--timeout 60]
    python -m rpeg.infra.ui_screenshot ...

The Prefect UI is a single-page app: plain ``chromium --screenshot`` often captures it
before it renders. This script starts ``/usr/bin/chromium`` (or ``$CHROMIUM``) headless with
a private profile and a DevTools port on 127.0.0.1, opens ``URL``, waits until the page's
text contains every ``--wait-text`` (and the network settles), then saves a PNG. Only the
``websockets`` package is needed (no Playwright). Everything stays on loopback.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and Path(env).exists():
        return env
    for c in CHROMIUM_CANDIDATES:
        if Path(c).exists():
            return c
    return None


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout: float) -> int:
    f = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(f.read_text().splitlines()[0])
        time.sleep(0.1)
    raise TimeoutError("chromium did not open its DevTools port")


def screenshot(
    url: str,
    out: str | Path,
    *,
    wait_text: list[str] | None = None,
    timeout: float = 60.0,
    width: int = 1400,
    height: int = 1000,
    settle_s: float = 1.5,
    chromium: str | None = None,
) -> Path:
    """Save a PNG of ``url`` to ``out`` once every ``wait_text`` is on the page."""
    from websockets.sync.client import connect

    exe = chromium or find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium found (apt-get install chromium, or set $CHROMIUM)")
    profile = Path(tempfile.mkdtemp(prefix="rpeg-chromium-"))
    cmd = [
        exe,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--metrics-recording-only",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        port = _devtools_port(profile, proc, timeout=min(timeout, 30.0))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t.get("type") == "page"]
        ws_url = pages[0]["webSocketDebuggerUrl"]
        ids = itertools.count(1)
        with connect(ws_url, max_size=64 * 2**20, open_timeout=10) as ws:

            def call(method: str, **params):
                i = next(ids)
                ws.send(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    msg = json.loads(ws.recv(timeout=timeout))
                    if msg.get("id") == i:
                        if "error" in msg:
                            raise RuntimeError(f"{method}: {msg['error']}")
                        return msg.get("result", {})

            call("Page.enable")
            call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout
            want = list(wait_text or [])
            text = ""
            while time.monotonic() < deadline:
                res = call(
                    "Runtime.evaluate", expression="document.body ? document.body.innerText : ''"
                )
                text = res.get("result", {}).get("value", "") or ""
                if text.strip() and all(w in text for w in want):
                    break
                time.sleep(0.5)
            else:
                raise TimeoutError(f"page never showed {want!r}; last text: {text[:500]!r}")
            time.sleep(settle_s)  # charts and artifacts render after the text
            data = call("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data))
        return out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument(
        "--wait-text",
        action="append",
        default=[],
        help="text that must be on the page (repeatable)",
    )
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1000)
    a = ap.parse_args(argv)
    p = screenshot(
        a.url, a.out, wait_text=a.wait_text, timeout=a.timeout, width=a.width, height=a.height
    )
    print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
