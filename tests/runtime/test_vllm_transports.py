"""Which transport a vLLM weight update takes, and the CUDA IPC path's wire forms and
worker side, on CPU (rpeg.runtime.engines.vllm_cuda_transfer). The fake's workers are the
real worker extension; CUDA IPC itself is replaced by a host stand-in (a handle names a
registered buffer) at both ends. The real IPC and NCCL paths: tests/runtime/test_vllm_gpu.py."""

from __future__ import annotations

import functools

import pytest
import torch
from fake_vllm import FakeLLM, check_wire, shard

from rpeg.errors import RpegError
from rpeg.runtime.engines import vllm as vllm_mod
from rpeg.runtime.engines.vllm import VLLMEngine
from rpeg.runtime.engines.vllm_cuda_transfer import (
    CUDA_IPC,
    GLOO,
    NCCL,
    DeviceId,
    IpcBucket,
    check_transport,
    choose_transport,
    parse_tcp,
    rebuild_bucket,
    send_ipc,
    share_bucket,
)
from rpeg.runtime.engines.vllm_transfer import BucketPlan, PlanEntry, plan_buckets
from rpeg.runtime.model_io import ActorCritic, create_tiny

CPU = DeviceId("cpu")
A, B, C = (DeviceId("cuda", f"GPU-{x}", i) for i, x in enumerate("abc"))


@pytest.mark.parametrize(
    ("source", "workers", "want"),
    [
        (CPU, [CPU], GLOO),  # vLLM's CPU build
        (CPU, [CPU, CPU], GLOO),
        (A, [DeviceId("cuda", "GPU-a", 3)], CUDA_IPC),  # same GPU, another index there
        (A, [A, A], CUDA_IPC),
        (A, [B], NCCL),  # the engine on another GPU
        (A, [B, C], NCCL),
        (A, [A, B], GLOO),  # mixed: NCCL refuses two members on GPU a
        (A, [B, B], GLOO),  # two workers on one GPU: NCCL refuses
        (A, [CPU], GLOO),
        (CPU, [A], GLOO),  # host tensors to a GPU engine: through host memory
    ],
)
def test_the_transport_follows_where_the_tensors_and_workers_are(source, workers, want):
    assert choose_transport(source, workers) == want


def test_bad_transport_names_and_addresses_are_refused_by_name():
    with pytest.raises(RpegError, match="'shm'; allowed: gloo, cuda_ipc, nccl"):
        check_transport("shm")
    with pytest.raises(RpegError, match="no workers"):
        choose_transport(A, [])
    assert parse_tcp("tcp:127.0.0.1:29512") == ("127.0.0.1", 29512)
    for bad in ("file:/tmp/x", "tcp:127.0.0.1", "tcp:host:port"):
        with pytest.raises(RpegError, match="expected tcp:HOST:PORT"):
            parse_tcp(bad)


def _ipc_bucket(event=b"\x01" * 64) -> IpcBucket:
    plan = BucketPlan("bfloat16", 40, (PlanEntry("a", (2, 3), 0, 6), PlanEntry("b", (4,), 16, 4)))
    return IpcBucket(plan, "GPU-a", 7, b"\x00\xffhandle", 4096, 512, b"rc\x00", 3, event, True)


@pytest.mark.parametrize("event", [b"\x01" * 64, None])
def test_ipc_metadata_round_trips_through_what_vllms_msgpack_carries(event):
    b = _ipc_bucket(event)
    wire = b.to_wire()
    check_wire(wire)  # bytes, numbers, strings and lists only
    assert IpcBucket.from_wire(wire) == b
    assert DeviceId.from_wire(A.to_wire()) == A


def test_the_fake_takes_ipc_handles_but_still_refuses_tensors_and_torch_types():
    llm = FakeLLM(1, [])
    with pytest.raises(TypeError, match="Tensor cannot cross"):
        llm.collective_rpc("rpeg_receive_ipc", args=([torch.zeros(2)],))
    raw = (torch.Tensor, (4,), (1,), 0, torch.storage.TypedStorage, torch.float32, 0, b"h")
    with pytest.raises(TypeError, match="cannot cross"):  # reduce_tensor's raw arguments
        llm.collective_rpc("rpeg_receive_ipc", args=([list(raw)],))


def test_host_buckets_and_buckets_of_another_gpu_are_refused_before_ipc():
    with pytest.raises(RpegError, match="of GPU GPU-a opened on GPU "):
        rebuild_bucket(_ipc_bucket(), torch.device("cpu"))
    with pytest.raises(RpegError, match="shares GPU tensors; this bucket is on cpu"):
        share_bucket(_ipc_bucket().plan, torch.zeros(40, dtype=torch.bfloat16))


class HostIpc:
    """CUDA IPC on CPU: ``share`` registers the packed bucket under a fresh handle,
    ``rebuild`` (set as each fake worker's ``_rpeg_rebuild``) returns it by handle."""

    def __init__(self):
        self.buffers: dict[bytes, torch.Tensor] = {}
        self.opened = 0

    def share(self, plan, flat):
        h = b"h%d" % len(self.buffers)
        self.buffers[h] = flat
        return IpcBucket(plan, "GPU-a", 0, h, flat.numel() * flat.element_size(), 0, b"rc", 0,
                         None, False)  # fmt: skip

    def rebuild(self, b, device):
        assert b.gpu_uuid == "GPU-a" and device.type == "cpu"
        self.opened += 1
        return self.buffers[b.storage_handle]

    def install(self, llm):
        for w in llm.workers:
            w._rpeg_rebuild = self.rebuild


@pytest.fixture(scope="module")
def tiny():
    return create_tiny(seed=0)


@pytest.mark.parametrize("tp", [1, 2])
def test_an_ipc_update_loads_every_ranks_shard_from_the_shared_buckets(tiny, tp):
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]  # the tied head is the embedding
    sd = {n: p.detach() + 1.0 for n, p in model.named_parameters()}
    llm, host = FakeLLM(tp, names), HostIpc()
    host.install(llm)
    plan = plan_buckets(list(sd.items()), 64 * 1024)
    done = send_ipc(llm, plan, sd, torch.device("cpu"), 60.0, share=host.share)
    assert done == [len(names)] * tp
    assert [c[1] for c in llm.calls] == ["rpeg_receive_ipc"]  # one RPC, handles only
    assert host.opened == len(plan) * tp and len(plan) > 1
    for r, w in enumerate(llm.workers):
        loaded = w.model_runner.model.loaded
        for n in names:
            assert torch.equal(loaded[n], shard(n, sd[n], r, tp))


def test_the_engine_takes_the_forced_ipc_transport_and_checks_every_worker(tiny, monkeypatch):
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    host = HostIpc()
    monkeypatch.setattr(vllm_mod, "send_ipc", functools.partial(send_ipc, share=host.share))
    sd = {k: v * 2.0 for k, v in ActorCritic(model).state_dict().items()}

    def engine(llm):
        host.install(llm)
        return VLLMEngine(llm, pad_id=0, eos_id=2, tensor_parallel_size=2,
                          tie_word_embeddings=True, sampling_params_cls=dict, timeout_s=60.0,
                          transport="cuda_ipc")  # fmt: skip

    llm = FakeLLM(2, names)
    eng = engine(llm)
    eng.update_weights(sd, policy_version=3)
    assert [c[1] for c in llm.calls if c[0] == "rpc"] == ["rpeg_receive_ipc"]  # no group
    assert eng.policy_version == 3 and eng.last_update.tensors == len(names)
    q = "model.layers.0.self_attn.q_proj.weight"
    halves = [w.model_runner.model.loaded[q] for w in llm.workers]
    assert torch.equal(torch.cat(halves), sd[f"lm.{q}"])
    eng.shutdown()

    eng = engine(FakeLLM(2, names, drop_rank=1))
    with pytest.raises(RpegError, match="reached 1 of 2 vLLM workers"):
        eng.update_weights(sd, policy_version=4)
    assert eng.policy_version == 0
    eng.shutdown()
    with pytest.raises(RpegError, match="allowed: gloo, cuda_ipc, nccl"):
        VLLMEngine(FakeLLM(1, names), pad_id=0, eos_id=2, transport="x")


def test_the_transport_is_chosen_per_update_and_the_workers_asked_once(tiny, monkeypatch):
    """Weights from the GPU at one sync and from the host at another (a restore): each update
    takes its own transport; the gloo group made for the first is kept for the third."""
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    host = HostIpc()
    monkeypatch.setattr(vllm_mod, "send_ipc", functools.partial(send_ipc, share=host.share))
    choices = iter([GLOO, CUDA_IPC, GLOO])
    monkeypatch.setattr(vllm_mod, "choose_transport", lambda source, workers: next(choices))
    llm = FakeLLM(1, names)
    host.install(llm)
    eng = VLLMEngine(llm, pad_id=0, eos_id=2, tie_word_embeddings=True, sampling_params_cls=dict,
                     timeout_s=60.0)  # fmt: skip
    sd = ActorCritic(model).state_dict()
    taken = []
    for v in (1, 2, 3):
        eng.update_weights(sd, policy_version=v)
        taken.append(eng.transport)
    eng.shutdown()
    assert taken == [GLOO, CUDA_IPC, GLOO]
    assert [c[1] for c in llm.calls if c[0] == "rpc"] == [
        "rpeg_device",
        "rpeg_join_update_group",
        "rpeg_receive_weights",
        "rpeg_receive_ipc",
        "rpeg_receive_weights",
        "rpeg_leave_update_group",
    ]
