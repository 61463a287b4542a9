"""The per-rank activation memory the runtime predicts (rpeg.perf.rank_memory.activation_bytes)
against what a rank of RPEG's own tensor parallelism keeps for backward, measured on two gloo
ranks by benchmarks/bench_tp_activations.py (saved tensors of a 2- less a 1-layer model):
the layer norms' inputs and outputs stay whole on every tp rank, the rest splits."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpeg.perf.rank_memory import activation_bytes

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tp_activations.py"
LINE = re.compile(
    r"hidden\s+(\d+) mlp\s+(\d+) heads\s+(\d+) kv\s+(\d+): tp1\s+([\d.]+)\s+tp2\s+([\d.]+)"
)


def test_predicted_activations_per_tp_rank_match_the_measured_within_two_percent():
    out = subprocess.run(
        [sys.executable, str(BENCH)], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    rows = [tuple(map(float, m.groups())) for m in LINE.finditer(out)]
    assert len(rows) >= 5, out
    for hidden, ffn, heads, kv, tp1, tp2 in rows:
        model = SimpleNamespace(
            hidden=int(hidden),
            ffn_hidden=int(ffn),
            kv_heads=int(kv),
            head_dim=int(hidden) // int(heads),
            layers=1,
        )
        for tp, measured in ((1, tp1), (2, tp2)):
            predicted = activation_bytes(model, 1.0, 4.0, tp, recompute=False) / 4.0
            assert predicted == pytest.approx(measured, rel=0.02), (hidden, ffn, kv, tp)
    # the multi-head constants of the single-process measurement: 10 x hidden + 4 x MLP
    mha = SimpleNamespace(hidden=256, ffn_hidden=1024, kv_heads=8, head_dim=32, layers=1)
    assert activation_bytes(mha, 1.0, 4.0, 1, recompute=False) / 4.0 == 10 * 256 + 4 * 1024
