"""Bit-exact Dask serialization for torch tensors of every dtype (bf16, fp8 included).

Dask's built-in torch serializer goes through numpy, which has no bfloat16/float8: such
tensors fail to serialize and there is no pickle fallback. :func:`register` installs a
"dask" serializer family for ``torch.Tensor`` that sends the raw bytes plus dtype and shape.
Every process (client, scheduler, workers) must call it: :mod:`rpeg.infra` does so via a
worker preload and :class:`rpeg.infra.cluster.Cluster`.
"""

from __future__ import annotations

_REGISTERED = False


def tensor_to_frames(t):
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    header = {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "requires_grad": False,
    }
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return header, [raw.numpy().tobytes()]


def tensor_from_frames(header, frames):
    import torch

    dtype = getattr(torch, header["dtype"])
    data = bytearray(b"".join(bytes(f) for f in frames))
    if not data:
        return torch.empty(header["shape"], dtype=dtype)
    flat = torch.frombuffer(data, dtype=torch.uint8).view(dtype)
    return flat.reshape(header["shape"])


def register() -> None:
    """Register the serializer (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch
    from distributed.protocol import dask_deserialize, dask_serialize

    dask_serialize.register(torch.Tensor)(tensor_to_frames)
    dask_deserialize.register(torch.Tensor)(tensor_from_frames)
    dask_serialize.register(torch.nn.Parameter)(tensor_to_frames)
    dask_deserialize.register(torch.nn.Parameter)(tensor_from_frames)
    _REGISTERED = True


def dask_setup(worker=None) -> None:  # a ``--preload`` module hook
    register()
