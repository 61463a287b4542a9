"""benchmarks/length_scan.py: the smallest max error over a grid of mean response lengths."""

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("length_scan", REPO / "benchmarks/length_scan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scan_reports_the_best_grid_point(capsys):
    scan = _load()
    argv = ["--prefix", "nemo-v0.5-h100bf16-llama", "--lo", "500", "--hi", "1500"]
    assert scan.main([*argv, "--step", "500"]) == 0
    out = capsys.readouterr().out
    maxes = [float(m) for m in re.findall(r"^mean=.*? max=\s*([\d.]+)%", out, re.M)]
    assert len(maxes) == 3  # 500, 1000, 1500
    best = float(re.search(r"best_max=([\d.]+)%", out).group(1))
    assert best == min(maxes)


def test_scan_refuses_an_empty_selection(capsys):
    assert _load().main(["--prefix", "no-such-row"]) == 2
