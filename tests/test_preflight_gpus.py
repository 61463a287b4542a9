"""The preflight counts the GPUs the compiled plan uses against what the workers see, before
any actor starts (CUDA simulated with DeviceView records; this machine has no GPU). Before:
the count followed ``cluster.device_type`` (default cpu) while the groups took CUDA from the
catalog cluster's name, so a GPU plan passed and failed later in NCCL or at the first
``.to("cuda")``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rpeg.infra.devices import DeviceView

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, ProblemsError
from rpeg.preflight import check_plan_devices, plan_gpus, preflight

CFG = RunConfig.from_dict({"cluster": {"name": "dgx-h100", "num_devices": 4}})


def _plan(*device_sets: list[int], device_type: str = "cuda"):
    groups = [SimpleNamespace(device_type=device_type, devices=d) for d in device_sets]
    return SimpleNamespace(actor_groups=groups)


def _view(host="h0", n=8, torch_cuda="13.0", smi=8, driver="13.0", visible=None):
    return DeviceView(host, n, torch_cuda, smi, driver, visible)


def test_plan_gpus_counts_distinct_cuda_devices():
    assert plan_gpus(_plan([0, 1], [2, 3], [0, 1])) == 4
    assert plan_gpus(_plan([0, 1], device_type="cpu")) == 0


def test_enough_gpus_pass():
    views = {f"w{i}": _view() for i in range(4)}
    assert check_plan_devices(CFG, _plan([0, 1, 2, 3]), views) == []


def test_more_gpus_than_workers_have_is_refused_with_the_numbers():
    views = {"w0": _view("a"), "w1": _view("a"), "w2": _view("b", n=1, smi=1)}
    ps = check_plan_devices(CFG, _plan([0, 1, 2, 3]), views)
    assert [p.where for p in ps] == ["cluster.num_devices"]
    assert "uses 4 GPUs but the workers have 3 (a: 2, b: 1" in ps[0].what


def test_gpu_plan_on_a_cpu_only_cluster_is_refused():
    views = {f"w{i}": _view(n=0, torch_cuda=None, smi=None, driver=None) for i in range(2)}
    ps = check_plan_devices(CFG, _plan([0, 1]), views)
    assert len(ps) == 1 and "'dgx-h100' is a GPU cluster" in ps[0].what
    assert "2 worker(s) see no CUDA device" in ps[0].what


def test_torch_newer_than_the_driver_is_refused():
    views = {"w0": _view(n=0, torch_cuda="13.0", driver="12.4")}
    ps = check_plan_devices(CFG, _plan([0]), views)
    assert "torch is built for CUDA 13.0 but the driver supports CUDA 12.4" in ps[0].what


def test_gpus_torch_cannot_see_are_named():
    views = {"w0": _view(n=0, torch_cuda=None, smi=8, driver="13.0")}
    ps = check_plan_devices(CFG, _plan([0]), views)
    assert "nvidia-smi lists 8 GPU(s)" in ps[0].what and "a CPU build" in ps[0].what


def test_workers_with_different_torch_builds_are_refused():
    views = {"w0": _view(torch_cuda="12.8", driver="13.0"), "w1": _view(torch_cuda="13.0")}
    ps = check_plan_devices(CFG, _plan([0, 1]), views)
    assert [p.what for p in ps] == ["the workers' torch builds differ: CUDA 12.8, 13.0"]


def test_one_gpu_each_workers_count_their_host_gpus():
    views = {f"w{i}": _view(n=1, visible=str(i)) for i in range(4)}
    assert check_plan_devices(CFG, _plan([0, 1, 2, 3]), views) == []


def test_local_preflight_refuses_a_gpu_plan_on_this_cpu_machine(tmp_path, monkeypatch):
    import rpeg.infra.devices as devices

    monkeypatch.setattr(devices, "_nvidia_smi", lambda: (None, None))
    cfg = RunConfig.from_dict(
        {"cluster": {"name": "dgx-h100", "num_devices": 2, "n_workers": 2},
         "runtime": {"output_dir": str(tmp_path / "out")}}
    )  # fmt: skip
    with pytest.raises(ConfigError) as e:
        preflight(cfg)
    assert any("see no CUDA device" in p.what for p in e.value.problems), e.value.problems


def test_unknown_cluster_is_not_silently_cpu():
    from rpeg.compile.layouts import _device_type

    with pytest.raises(ProblemsError, match="unknown cluster 'nope'"):
        _device_type(SimpleNamespace(cluster=SimpleNamespace(name="nope")))


def test_flow_refuses_before_any_actor_when_the_workers_lack_gpus():
    from rpeg.flows import run_setup

    closed = []
    client = SimpleNamespace(run=lambda fn: {"tcp://w0": _view(n=0, torch_cuda=None, smi=None)})
    cl = SimpleNamespace(client=client, close=lambda: closed.append(True))
    with pytest.raises(ConfigError, match="see no CUDA device"):
        run_setup._check_worker_gpus(CFG, _plan([0]), cl, owned=True)
    assert closed == [True]
    run_setup._check_worker_gpus(CFG, _plan([0], device_type="cpu"), cl, owned=True)  # CPU plan
