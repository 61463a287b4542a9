"""Which GPU a rank lands on, with CUDA simulated (torch.cuda.device_count monkeypatched and
each worker's CUDA_VISIBLE_DEVICES set as dask-cuda or plain workers set it).

dask-cuda gives worker w of a 4-GPU host the full list rotated to start at its own GPU
("2,3,0,1" for w=2), so its own GPU is cuda:0; the old rule (plan device index mod visible
GPUs) sent worker 2's rank to cuda:2 = physical GPU 0, worker 0's GPU (NCCL: "Duplicate GPU
detected")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rpeg.compile import GroupSpec
from rpeg.runtime.actors import rendezvous
from rpeg.runtime.actors.rendezvous import WorkerGpus, gpu_slots, rank_device

GROUP = GroupSpec(
    name="g0",
    devices=(0, 1, 2, 3),
    world_size=4,
    roles=("actor",),
    trainable=("actor",),
    units=(),
    dp=4,
    device_type="cuda",
    backend="nccl",
)


def _rotated(w: int, n: int) -> str:
    return ",".join(str((w + i) % n) for i in range(n))


def _physical(visible: str | None, idx: int) -> int:
    return int(visible.split(",")[idx]) if visible else idx


def _place(monkeypatch, views: dict[str, WorkerGpus]) -> list[int]:
    """Physical GPU of each rank r of GROUP, placed on worker r (the lifecycle's
    ``workers[dev % len(workers)]``), each rank's device decided in its worker's env."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    slots = gpu_slots(views)
    out = []
    for rank, addr in enumerate(views):
        v = views[addr]
        n = len(v.visible.split(",")) if v.visible else 4
        monkeypatch.setattr(torch.cuda, "device_count", lambda n=n: n)
        if v.visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", v.visible)
        dev = rank_device(GROUP, rank, slots[addr])
        assert dev.type == "cuda"
        out.append(_physical(v.visible, dev.index))
    return out


def test_dask_cuda_rotated_lists_give_every_rank_its_own_gpu(monkeypatch):
    views = {f"tcp://w{w}": WorkerGpus("host-a", _rotated(w, 4)) for w in range(4)}
    assert gpu_slots(views) == dict.fromkeys(views, 0)
    assert sorted(_place(monkeypatch, views)) == [0, 1, 2, 3]


def test_plain_workers_seeing_every_gpu_take_their_slot(monkeypatch):
    views = {f"tcp://w{w}": WorkerGpus("host-a", None) for w in range(4)}
    assert list(gpu_slots(views).values()) == [0, 1, 2, 3]
    assert _place(monkeypatch, views) == [0, 1, 2, 3]


def test_slots_count_per_host():
    views = {
        "tcp://a0": WorkerGpus("a", None),
        "tcp://b0": WorkerGpus("b", None),
        "tcp://a1": WorkerGpus("a", None),
        "tcp://b1": WorkerGpus("b", "1,0"),
        "tcp://b2": WorkerGpus("b", "0,1"),
    }
    # host a shares one view: slots 0, 1; host b's workers see different lists: each owns 0
    assert gpu_slots(views) == {"tcp://a0": 0, "tcp://b0": 0, "tcp://a1": 1, "tcp://b1": 0,
                                "tcp://b2": 0}  # fmt: skip


def test_more_workers_than_gpus_on_a_host_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeError, match="GPU slot 2 of its host but sees 2 GPU"):
        rank_device(GROUP, 2, gpu_slot=2)


def test_worker_gpus_reads_this_process(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0")
    assert rendezvous.worker_gpus().visible == "3,0"


def test_cpu_group_ignores_slots():
    assert rank_device(dataclasses.replace(GROUP, device_type="cpu"), 1, 1) == torch.device("cpu")
