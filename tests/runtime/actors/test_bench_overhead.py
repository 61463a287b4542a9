"""benchmarks/bench_overhead.py: how a Prefect + Dask step splits into the stages' own time
and the runtime's, on a hand-written timeline (the run_train ``_extra`` schema)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_overhead", REPO / "benchmarks/bench_overhead.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _span(step, rank, stage, a, b):
    return {
        "step": step,
        "unit": stage,
        "stage": stage,
        "rank": rank,
        "pid": 1,
        "start_s": a,
        "end_s": b,
    }


def test_a_step_splits_into_compute_and_the_runtimes_parts():
    # step 0 (history's step 1) begins its first unit 10 s after the run's origin; the chain of
    # two units spans 0.0-1.0 s of it; the flow measured 1.02 s from BeginStep to EndStep.
    # rank 0: 0.40 + 0.58 = 0.98 s of stages in 10.004-10.990; rank 1: 0.39 + 0.573 s in
    # 10.006-10.985 (it waits less in the collectives)
    extra = {
        "step_offsets_s": {"0": 10.0},
        "timeline": [
            {"step": 0, "start_s": 0.0, "end_s": 0.5},
            {"step": 0, "start_s": 0.5, "end_s": 1.0},
        ],
        "stage_spans": [
            _span(0, 0, "generate", 10.004, 10.404),
            _span(0, 0, "train_actor", 10.410, 10.990),
            _span(0, 1, "generate", 10.006, 10.396),
            _span(0, 1, "train_actor", 10.412, 10.985),
        ],
        "history": [{"step": 1, "step_s": 1.02}],
    }
    (p,) = _bench().split_steps(extra)
    assert p["step"] == 1 and p["units"] == 2
    assert p["compute"] == pytest.approx(0.98)  # the slowest rank's stages
    assert p["runtime"] == pytest.approx(0.04)
    assert p["outside"] == pytest.approx(0.02)  # 1.02 s step, 1.0 s in the call
    assert p["to_rank"] == pytest.approx(0.004)  # call at 10.0, first stage at 10.004
    assert p["back"] == pytest.approx(0.010)  # last stage ends 10.990, call returns 11.0
    assert p["between"] == pytest.approx(0.006)  # 10.004-10.990 less 0.98 of stages
    assert p["gaps"] == pytest.approx(0.006)  # rank 0's 10.404 -> 10.410
    assert p["skew"] == pytest.approx(0.0)  # rank 1 ran inside rank 0's span
    parts = ("outside", "to_rank", "between", "back")
    assert sum(p[k] for k in parts) == pytest.approx(p["runtime"])


def test_a_step_without_spans_is_left_out():
    extra = {
        "step_offsets_s": {"0": 0.0},
        "timeline": [{"step": 0, "start_s": 0.0, "end_s": 0.5}],
        "stage_spans": [],
        "history": [{"step": 1, "step_s": 0.6}],
    }
    assert _bench().split_steps(extra) == []


def test_the_one_rank_arm_keeps_the_single_process_layout(tmp_path):
    # --one-rank: one worker whose one rank runs at the local arm's threads; the default arm
    # stays 2 workers x 1 thread (data parallel)
    local, one = _bench()._configs(None, 3, str(tmp_path), 2, 1)
    _, two = _bench()._configs(None, 3, str(tmp_path), 2, 2)
    assert local.runtime.torch_threads == one.runtime.torch_threads == 2
    assert (one.cluster.n_workers, one.cluster.num_devices) == (1, 1)
    assert (two.cluster.n_workers, two.cluster.num_devices, two.runtime.torch_threads) == (2, 2, 1)
    assert one.runtime.output_dir != two.runtime.output_dir
