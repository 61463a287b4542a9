"""Weight sync straight from device memory (rpeg.runtime.actors.weight_sync).

The device path is rehearsed on the ``meta`` device: a meta tensor has no data, so any copy
to the host (``.cpu()``, ``.to("cpu")``, ``.item()``) raises -- the path passes only if
buckets are built, broadcast and unpacked where the weights live. The broadcast is an
in-process double that, like a process group's, refuses a receive buffer whose shape or
dtype differs from what was sent.
"""

from __future__ import annotations

import pytest
import torch

from rpeg.runtime.actors import weight_sync as WS


class FakeBroadcast:
    """``rendezvous.broadcast`` between a sender and a receiver in one process: the sender's
    tensors are recorded (copied), a receiver's buffer is filled from the next one."""

    def __init__(self):
        self.sent: list[torch.Tensor] = []
        self.devices: list[str] = []
        self.receiving = False

    def __call__(self, pg, tensor: torch.Tensor, root: int = 0) -> None:
        self.devices.append(tensor.device.type)
        if not self.receiving:
            self.sent.append(tensor.clone())
            return
        got = self.sent.pop(0)
        if got.shape != tensor.shape or got.dtype != tensor.dtype:
            raise RuntimeError(
                f"broadcast: got {got.dtype}{tuple(got.shape)}, buffer "
                f"{tensor.dtype}{tuple(tensor.shape)}"
            )
        tensor.copy_(got)


@pytest.fixture
def fake(monkeypatch):
    f = FakeBroadcast()
    monkeypatch.setattr("rpeg.runtime.actors.rendezvous.broadcast", f)
    return f


def _weights(device="cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = {
        "a.weight": torch.randn(6, 5, generator=g),
        "b.weight": torch.randn(40, generator=g).to(torch.bfloat16),
        "c.bias": torch.randn(3, generator=g),
        "d.steps": torch.arange(4),
    }
    return {k: v.to(device) for k, v in w.items()}


def _meta(w):
    return {k: (tuple(v.shape), v.dtype) for k, v in w.items()}


def test_cpu_round_trip_is_bit_exact(fake):
    w = _weights()
    nbytes, n = WS.broadcast_weights("pg", w, 7, bucket_bytes=64, device=torch.device("cpu"))
    # fp32: a (120 B) alone, c (12 B); bf16: b (80 B) alone; int64: d (32 B)
    assert n == 4 and nbytes == 30 * 4 + 40 * 2 + 3 * 4 + 4 * 8
    fake.receiving = True
    got, version = WS.receive_weights("pg", _meta(w), 64, torch.device("cpu"))
    assert version == 7
    for k, v in w.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        assert got[k].device.type == "cpu"
    # copies, not views of a receive buffer
    assert got["a.weight"]._base is None


def test_device_path_makes_no_host_copy(fake, monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a host copy on the device path")

    monkeypatch.setattr(torch.Tensor, "cpu", refuse)
    w = _weights("meta")
    meta = torch.device("meta")
    nbytes, n = WS.broadcast_weights("pg", w, 3, bucket_bytes=64, device=meta)
    assert n == 4 and set(fake.devices) == {"meta"}  # the version too
    assert [b.shape for b in fake.sent[1:]] == [(30,), (3,), (40,), (4,)]
    fake.receiving = True
    fake.sent.pop(0)  # the version (its .item() is a host read by design)
    got = WS.receive_buckets("pg", _meta(w), 64, meta)
    assert set(fake.devices) == {"meta"}
    for k, v in w.items():
        assert got[k].device.type == "meta" and got[k].shape == v.shape, k
        assert got[k].dtype == v.dtype and got[k]._base is not None, k  # views of a bucket


def test_sharded_source_streams_buckets_on_the_device(fake, monkeypatch):
    """A model's weights fetched one tensor at a time, cast to the compute dtype, packed on
    its device; a trainer rank outside the sync group (pg None) broadcasts nothing."""
    from rpeg.runtime.sharding import full_tensor_source

    monkeypatch.setattr(torch.Tensor, "cpu", lambda *a, **k: pytest.fail("host copy"))
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    meta, fetch = full_tensor_source(model, torch.bfloat16)
    assert {m[1] for m in meta.values()} == {torch.bfloat16}
    asked = []

    def counted(name):
        asked.append(name)
        return fetch(name)

    buckets = WS.stream_buckets(meta, counted, 32, torch.device("meta"))
    nbytes, n = WS.send_buckets(None, buckets, 1, torch.device("meta"))
    assert fake.devices == [] and nbytes == (32 + 8 + 16 + 2) * 2
    # 16 bf16 elements a bucket, names in order: 0.bias (8) | 0.weight (32) | 1.bias (2) |
    # 1.weight (16: with 1.bias it would be 18)
    assert sorted(asked) == sorted(meta) and n == 4


def test_pack_unpack_keep_their_cpu_contract():
    w = _weights()
    buckets = WS.pack(w, 64)
    assert all(b.flat.device.type == "cpu" for b in buckets)
    out = WS.unpack(buckets)
    for k, v in w.items():
        assert torch.equal(out[k], v)
    views = WS.unpack_views(buckets)
    views["c.bias"].zero_()  # a view writes through to its bucket; unpack's copy did not
    assert not torch.equal(out["c.bias"], views["c.bias"])
