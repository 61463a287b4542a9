"""Drive the Prefect UI with a real, headless Chromium (Playwright): screenshots, forms.

    python infra/ui_screenshot.py URL OUT.png [--wait-text TEXT] [--full-page] [--timeout 60]
    python -m rpeg.infra.ui_screenshot ...

The Prefect UI is a single-page app: it must render before a screenshot shows anything, so
:func:`screenshot` waits until the page's text contains every ``--wait-text``. The browser
is the system's Chromium (Debian: ``apt-get install chromium``; ``$CHROMIUM`` overrides
the path) driven by Playwright's Python package (``pip install playwright``; its own
browser download, ``playwright install``, is never needed). It starts with no sandbox,
GPU, QUIC, sync, component updates or background networking: every request stays on
the loopback server under test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and Path(env).exists():
        return env
    for c in CHROMIUM_CANDIDATES:
        if Path(c).exists():
            return c
    return None


def missing() -> str | None:
    """Why the browser cannot run here (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright)"
    if find_chromium() is None:
        return "no chromium (apt-get install chromium, or set $CHROMIUM)"
    return None


@contextlib.contextmanager
def browser(*, chromium: str | None = None) -> Iterator[Any]:
    """A Playwright ``Browser`` on the system's Chromium."""
    from playwright.sync_api import sync_playwright

    exe = chromium or find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium found (apt-get install chromium, or set $CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=list(CHROMIUM_ARGS), headless=True)
        try:
            yield b
        finally:
            b.close()


def wait_for_text(page: Any, texts: list[str], timeout: float = 60.0) -> None:
    """Wait until the page's text contains every one of ``texts``."""
    for t in texts:
        page.get_by_text(re.compile(re.escape(t))).first.wait_for(timeout=timeout * 1000)


def screenshot(
    url: str,
    out: str | Path,
    *,
    wait_text: list[str] | None = None,
    timeout: float = 60.0,
    width: int = 1400,
    height: int = 1000,
    full_page: bool = False,
    settle_s: float = 1.0,
    chromium: str | None = None,
) -> Path:
    """Save a PNG of ``url`` to ``out`` once every ``wait_text`` is on the page."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with browser(chromium=chromium) as b:
        page = b.new_page(viewport={"width": width, "height": height})
        page.goto(url, timeout=timeout * 1000)
        wait_for_text(page, list(wait_text or []), timeout)
        page.wait_for_timeout(settle_s * 1000)  # charts and images render after the text
        page.screenshot(path=str(out), full_page=full_page)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument(
        "--wait-text", action="append", default=[], help="text that must be on the page"
    )
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--full-page", action="store_true")
    a = ap.parse_args(argv)
    p = screenshot(
        a.url,
        a.out,
        wait_text=a.wait_text,
        timeout=a.timeout,
        width=a.width,
        height=a.height,
        full_page=a.full_page,
    )
    print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
