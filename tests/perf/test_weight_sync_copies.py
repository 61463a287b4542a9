"""The in-process weight sync of RPEG's CPU runtime at k = 0 on the training devices: free
when the generator is the training model itself, priced when it keeps its own copy -- the
trainer split into pipeline stages (every tensor broadcast from the stage holding it over
the pipeline group, rpeg.runtime.pipeline.pipeline_weight_source, then copied) or another tp.
Before, every same-device k = 0 sync was priced as a version bump (0.002 s) while a pp=2
trainer's measured 0.03-0.05 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg import specs
from rpeg.compile.sources import resolve
from rpeg.config import RunConfig
from rpeg.perf import predict
from rpeg.perf.prediction import Workload

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _sync(name: str, **over):
    cfg = RunConfig.from_yaml(CONFIGS / name).with_overrides(over)
    graph, plan = resolve(None, cfg)
    return predict(graph, plan, Workload.from_config(cfg.workload)).stages["sync_weights"]


def test_the_generator_that_is_the_training_model_costs_a_version_bump():
    s = _sync("dp2-cpu.yaml")
    assert s.detail["in_process"] == 1.0 and s.detail["refit_bytes_s"] == 0.0


def test_a_pipelined_trainers_copy_is_refreshed_through_one_broadcast_per_tensor():
    s = _sync("pp2-cpu.yaml")
    cl = specs.cluster("local-cpu")
    m = specs.model("rpeg-tiny")
    assert s.detail["stage_broadcasts_s"] >= m.hf_tensors * cl.collective_latency_s
    assert s.time_s > s.detail["stage_broadcasts_s"]  # and the copy itself


def test_another_tp_keeps_its_own_copy_without_stage_broadcasts():
    s = _sync("dp2-cpu.yaml", **{"plan.units.generate.tp": 2})
    assert s.detail["refit_bytes_s"] > 0.0
    assert "stage_broadcasts_s" not in s.detail
    assert s.time_s == pytest.approx(
        s.detail["refit_bytes_s"] + s.detail["refit_tensors_s"] + s.detail["dispatch_s"]
    )
