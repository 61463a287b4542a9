"""Install: ranges in the core, the CPU wheel through a constraints file that CI uses."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _deps() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = {}
    for d in data["project"]["dependencies"]:
        m = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", d)
        out[m.group(1).lower()] = m.group(3)
    return out


def test_core_dependencies_are_ranges_not_pins():
    """torch==2.13.0 in the core made `pip install ".[gpu]"` unresolvable (vllm pins its own
    torch); prefect and dask were pinned exactly."""
    deps = _deps()
    for name in ("torch", "prefect", "dask", "distributed"):
        spec = deps[name]
        assert "==" not in spec and ">=" in spec and "<" in spec, (name, spec)


def test_cpu_constraints_pin_the_installed_cpu_torch_and_ci_uses_them():
    pins = [
        ln.strip()
        for ln in (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert pins == [f"torch=={version('torch').split('+')[0]}"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert '-c constraints/cpu.txt -e ".[dev]"' in ci
    assert "check_gpu_extra.sh" in ci and "graphviz" in ci and "chromium" in ci
