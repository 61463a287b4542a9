"""benchmarks/bench_peer.py imports and parses its arguments (the benchmark itself is not a
test: it installs nothing and runs minutes)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_peer", REPO / "benchmarks/bench_peer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_peer_parses_its_arguments():
    b = _bench()
    a = b.parse(["--steps", "10", "--threads", "2,1", "--systems", "hand,local"])
    assert a.thread_list == [2, 1] and a.system_list == ["hand", "local"]
    assert b.rule_reward("so 12 + 3 = 15", "15") == 1.0 and b.rule_reward("14", "15") == 0.0
    for bad in (["--threads", "0"], ["--systems", "vllm"], ["--steps", "2", "--skip", "3"]):
        with pytest.raises(SystemExit):
            b.parse(bad)
