"""Process groups wait as long as the config says (default: long enough for the slowest step
the plan predicts) and a CUDA rank's group is bound to its GPU (``device_id``). Before: a
fixed 120 s (a dp rank whose peer still generates long rollouts was aborted by NCCL's
watchdog) and no ``device_id``. CUDA is simulated: ``init_process_group`` is captured."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.actors import rendezvous
from rpeg.runtime.actors.predicted import (
    MIN_COLLECTIVE_TIMEOUT_S,
    collective_timeout_s,
    predicted_step_s,
)
from rpeg.runtime.actors.programs import group_program
from rpeg.runtime.actors.rank_models import RankModels


def test_config_value_wins():
    cfg = RunConfig.from_dict({"runtime": {"collective_timeout_s": 7200}})
    assert collective_timeout_s(cfg, step_s=10_000.0) == 7200.0


def test_default_is_four_predicted_steps_with_a_30_min_floor():
    cfg = RunConfig()
    assert collective_timeout_s(cfg, step_s=1000.0) == 4000.0  # 4 x 1000 s
    assert collective_timeout_s(cfg, step_s=3.0) == 1800.0  # the floor
    assert MIN_COLLECTIVE_TIMEOUT_S == 1800.0


def test_default_asks_the_performance_model():
    cfg = RunConfig()
    step = predicted_step_s(cfg)
    assert step is not None and step > 0
    assert collective_timeout_s(cfg) == max(1800.0, 4 * step)


@pytest.mark.parametrize("bad", [0, -5, "soon"])
def test_bad_timeout_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match="collective_timeout_s"):
        RunConfig.from_dict({"runtime": {"collective_timeout_s": bad}})


def _group(device: torch.device, backend: str):
    from rpeg.compile import GroupSpec

    return GroupSpec(
        name="g0",
        devices=(0, 1),
        world_size=2,
        roles=("actor",),
        trainable=("actor",),
        units=(),
        dp=2,
        device_type=device.type,
        backend=backend,
    )


def _rank(device: torch.device, backend: str, program) -> RankModels:
    r = object.__new__(RankModels)  # no roles built: only the process-group join is tested
    r.program, r.group, r.rank, r.world_size = program, _group(device, backend), 1, 2
    r.device, r.tls, r.store = device, None, None
    r._apply_layout = lambda: None
    return r


def _capture(monkeypatch) -> dict:
    seen: dict = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: seen.update(kw, backend=backend)
    )
    monkeypatch.setattr(rendezvous, "join_store", lambda addr, *a, **k: ("store", addr))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.update(set_device=d))
    return seen


def test_cuda_rank_joins_with_device_id_and_the_group_timeout(monkeypatch):
    seen = _capture(monkeypatch)
    r = _rank(torch.device("cuda", 1), "nccl", SimpleNamespace(collective_timeout_s=5400.0))
    assert r.init_process_group("file:/x")
    assert seen["backend"] == "nccl"
    assert seen["device_id"] == torch.device("cuda", 1)
    assert seen["set_device"] == torch.device("cuda", 1)
    assert seen["timeout"] == datetime.timedelta(seconds=5400)


def test_cpu_rank_has_no_device_id_and_the_config_timeout(monkeypatch):
    seen = _capture(monkeypatch)
    cfg = RunConfig.from_dict({"runtime": {"collective_timeout_s": 900}})
    cpu = torch.device("cpu")
    # the driver's program carries the config's timeout (rpeg.runtime.actors.programs)
    program = group_program(cfg, _group(cpu, "gloo"), staleness=0)
    assert program.collective_timeout_s == 900.0 and program.predicted_step_s is None
    r = _rank(cpu, "gloo", program)
    r.init_process_group("file:/x")
    assert seen["device_id"] is None and "set_device" not in seen
    assert seen["timeout"] == datetime.timedelta(seconds=900)
