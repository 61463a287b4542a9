"""What a vLLM engine may leave behind: its processes (the engine core and its workers, which
vLLM names ``VLLM::EngineCore`` / ``VLLM::Worker...``) and its shared-memory segments
(/dev/shm/psm_*). Tests compare the sets before and after (other programs' are left alone)."""

from __future__ import annotations

import time
from pathlib import Path


def shm_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("psm_*")}


def vllm_processes() -> set[int]:
    """Live processes on this machine whose title is vLLM's (``VLLM::...``)."""
    import psutil

    out = set()
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            title = " ".join(p.info["cmdline"] or []) or (p.info["name"] or "")
            if title.startswith("VLLM::") or (p.info["name"] or "").startswith("VLLM::"):
                out.add(p.info["pid"])
        except psutil.Error:
            continue
    return out


def settle(check, timeout_s: float = 30.0):
    """``check()`` until it returns something falsy, or its last value after ``timeout_s``
    (a process being shut down takes a moment to go)."""
    t_end = time.monotonic() + timeout_s
    got = check()
    while got and time.monotonic() < t_end:
        time.sleep(0.5)
        got = check()
    return got
