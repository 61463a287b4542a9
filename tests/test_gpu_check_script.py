"""scripts/gpu_check.py's figures from hand-made step records and a hand-made prediction, and
its config for each device (the run itself is the CPU rehearsal, scripts/device_rehearsal.sh)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rpeg.config import RunConfig

_spec = importlib.util.spec_from_file_location(
    "gpu_check", Path(__file__).parents[1] / "scripts" / "gpu_check.py"
)
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

PRED = {
    "tokens_per_step": 1000.0,
    "device_memory_gb": {"0": 2.0, "1": 3.0},
    "stages": {
        "generate": {"kinds": ["generate"], "time_s": 4.0, "peak_memory_gb": 1.0},
        "train_actor": {"kinds": ["train_actor"], "time_s": 2.0, "peak_memory_gb": 3.0},
    },
}
HIST = [
    {
        "unit_s/generate": 3.0,
        "unit_s/train_actor": 1.0,
        "gen_tokens_per_s": 90.0,
        "num_tokens": 800,
    },
    {
        "unit_s/generate": 5.0,
        "unit_s/train_actor": 2.0,
        "gen_tokens_per_s": 70.0,
        "num_tokens": 800,
    },
    {
        "unit_s/generate": 4.0,
        "unit_s/train_actor": 4.0,
        "gen_tokens_per_s": 80.0,
        "num_tokens": 800,
    },
]


def test_stage_rows_take_medians_and_price_the_same_tokens():
    rows = {r["stage"]: r for r in gpu_check.stage_rows(HIST, PRED)}
    g, t = rows["generate"], rows["train_actor"]
    assert g["measured_s"] == 4.0 and g["measured_tokens_per_s"] == 200.0  # 800 tokens / 4 s
    assert g["measured_gen_tokens_per_s"] == 80.0 and t["measured_gen_tokens_per_s"] is None
    assert t["measured_s"] == 2.0 and t["measured_tokens_per_s"] == 400.0  # 800 tokens / 2 s
    assert g["predicted_s"] == 4.0 and g["predicted_tokens_per_s"] == 250.0  # 1000 / 4
    assert t["predicted_tokens_per_s"] == 500.0
    assert t["predicted_peak_memory_gib"] == pytest.approx(3e9 / 2**30)


def test_a_stage_the_run_did_not_time_is_none():
    rows = gpu_check.stage_rows([{"num_tokens": 10}], PRED)
    assert [r["measured_s"] for r in rows] == [None, None]


def test_memory_rows_prefer_the_device_allocator():
    summary = {"peak_memory": {"g0": [{"device": "cuda:0", "peak_device_bytes": 2**31,
                                       "peak_rss_bytes": 2**33},
                                      {"device": "cpu", "peak_rss_bytes": 2**30}]}}  # fmt: skip
    rows = gpu_check.memory_rows(summary, PRED)
    assert [r["measured_peak_gib"] for r in rows] == [2.0, 1.0]
    assert rows[0]["what"] == "device allocator" and rows[1]["what"] == "process resident set"
    assert rows[0]["predicted_peak_gib"] == pytest.approx(3e9 / 2**30)  # the largest device


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_configs_validate(tmp_path, device):
    cfg = RunConfig.from_dict(gpu_check.check_config(device, 2, tmp_path, "dgx-h200"))
    if device == "cpu":
        assert cfg.cluster.name == "local-cpu" and cfg.cluster.num_devices == 2
        assert cfg.workload.precision == "fp32" and cfg.model.tiny_shape["num_hidden_layers"] == 2
    else:
        assert cfg.cluster.name == "dgx-h200" and cfg.workload.precision == "bf16"


def test_gpu_names_map_to_catalog_clusters():
    assert gpu_check.cluster_for("NVIDIA H200") == "dgx-h200"
    assert gpu_check.cluster_for("NVIDIA GH200 480GB") == "gh200-alps"
    assert gpu_check.cluster_for("NVIDIA H100 80GB HBM3") == "dgx-h100"
    assert gpu_check.cluster_for("Tesla V100") == "dgx-h100"  # the default


def test_memory_rows_use_the_ranks_predicted_peak_and_the_margin_flags_what_is_off():
    summary = {
        "peak_memory": {"g0": [{"device": "cpu", "peak_rss_bytes": 2**30}]},
        "predicted_peak_memory": {"g0": {"peak_gb": 2**31 / 1e9}},
    }
    rows = gpu_check.memory_rows(summary, PRED)
    assert rows[0]["predicted_peak_gib"] == pytest.approx(2.0)  # the rank's, not the unit's
    result = {"step_s": 1.0, "predicted_step_s": 1.2, "memory": rows}
    assert gpu_check.off_margin(result, None) == []
    off = gpu_check.off_margin(result, 0.4)  # memory 1 vs 2 GiB: -50%; step -17%
    assert len(off) == 1 and off[0].startswith("peak memory g0 rank 0")
