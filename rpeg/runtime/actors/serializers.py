"""Bit-exact, zero-copy Dask serialization for torch tensors (every dtype) and batches.

Dask's built-in torch serializer goes through numpy, which has no bfloat16/float8: such
tensors fail to serialize and there is no pickle fallback. :func:`register` installs a
"dask" serializer family for ``torch.Tensor`` that sends the raw bytes (one frame, a view of
the tensor's memory: no copy on the sending side) plus dtype and shape, and one for
:class:`rpeg.runtime.batch.RolloutBatch`: every tensor field is its own frame (so batches are
no longer pickled in-band as one dataclass), and the per-token fields are *packed*: a
right-padded ``[B, R]`` field travels as the concatenation of each row's first ``len_i``
tokens (``len_i`` = the response length), a left-padded prompt field as each row's last
``plen_i`` tokens, and the receiver re-pads. A 64 x 8192 batch whose responses average 2k
tokens then moves a quarter of its padded bytes. Texts travel in the header.

Every process (client, scheduler, workers) must call :func:`register`: :mod:`rpeg.infra` does
so via a worker preload (this module's :func:`dask_setup`) and
:class:`rpeg.infra.cluster.Cluster`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch

    from rpeg.runtime.batch import RolloutBatch

    #: one frame of a Dask message (a view of a sender's tensor, or received bytes)
    Frame: TypeAlias = bytes | bytearray | memoryview
    #: a serializer's output: the header (plain data) and the frames
    Frames: TypeAlias = tuple[dict[str, Any], list[memoryview]]

_REGISTERED = False


def _raw(t: torch.Tensor) -> memoryview:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if not t.numel():
        return memoryview(b"")
    # numpy's stubs give ndarray the buffer protocol (__buffer__) only for Python >= 3.12
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


def _from_raw(frame: Frame, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    import torch

    if not len(frame):
        return torch.empty(shape, dtype=dtype)
    mv = memoryview(frame)
    if mv.readonly:  # an in-process hand-over: own the bytes, tensors may be written later
        mv = memoryview(bytearray(mv))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flat = torch.frombuffer(mv, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def tensor_to_frames(t: torch.Tensor) -> Frames:
    header: dict[str, Any] = {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "requires_grad": False,
    }
    return header, [_raw(t)]


def tensor_from_frames(header: dict[str, Any], frames: Sequence[Frame]) -> torch.Tensor:
    import torch

    dtype = getattr(torch, header["dtype"])
    frame = frames[0] if len(frames) == 1 else b"".join(bytes(f) for f in frames)
    return _from_raw(frame, dtype, header["shape"])


# --------------------------------------------------------------------------- batches
def _prefix_lengths(mask: torch.Tensor) -> torch.Tensor | None:
    """Row lengths when ``mask`` is a right-padded prefix mask (ones then zeros), else None."""
    import torch

    lens = mask.sum(-1)
    ref = torch.arange(mask.shape[1]).unsqueeze(0) < lens.unsqueeze(1)
    return lens if torch.equal(mask.bool(), ref) else None


def _suffix_lengths(mask: torch.Tensor) -> torch.Tensor | None:
    """Row lengths when ``mask`` is a left-padded suffix mask (zeros then ones), else None."""
    import torch

    lens = mask.sum(-1)
    w = mask.shape[1]
    ref = torch.arange(w).unsqueeze(0) >= (w - lens).unsqueeze(1)
    return lens if torch.equal(mask.bool(), ref) else None


def _pack(t: torch.Tensor, lens: torch.Tensor, left: bool) -> torch.Tensor:
    """Rows of ``t`` ``[B, W]`` without their padding, concatenated."""
    import torch

    w = t.shape[1]
    keep = torch.arange(w).unsqueeze(0)
    keep = keep >= (w - lens).unsqueeze(1) if left else keep < lens.unsqueeze(1)
    return t[keep]


def _unpack(
    flat: torch.Tensor, lens: torch.Tensor, width: int, left: bool, dtype: torch.dtype
) -> torch.Tensor:
    import torch

    out = torch.zeros((len(lens), width), dtype=dtype)
    keep = torch.arange(width).unsqueeze(0)
    keep = keep >= (width - lens).unsqueeze(1) if left else keep < lens.unsqueeze(1)
    out[keep] = flat
    return out


def batch_to_frames(b: RolloutBatch) -> Frames:
    import dataclasses

    from rpeg.runtime.batch import PROMPT_FIELDS, TOKEN_FIELDS

    r_lens = _prefix_lengths(b.response_mask)
    p_lens = _suffix_lengths(b.prompt_mask)
    header: dict[str, Any] = {"fields": [], "scalars": {}, "texts": {}}
    frames: list[memoryview] = []
    for lens, name in ((r_lens, "_r_lens"), (p_lens, "_p_lens")):
        if lens is not None:
            header[name] = len(frames)
            frames.append(_raw(lens.to(dtype=_int32())))
    for f in dataclasses.fields(b):
        v = getattr(b, f.name)
        if v is None:
            continue
        if isinstance(v, list):
            header["texts"][f.name] = v
            continue
        if not hasattr(v, "dtype"):
            header["scalars"][f.name] = v
            continue
        packed = None
        if f.name in TOKEN_FIELDS and r_lens is not None:
            packed = "right"
            data = _pack(v, r_lens, left=False)
        elif f.name in PROMPT_FIELDS and p_lens is not None:
            packed = "left"
            data = _pack(v, p_lens, left=True)
        else:
            data = v
        header["fields"].append(
            {
                "name": f.name,
                "dtype": str(v.dtype).removeprefix("torch."),
                "shape": list(v.shape),
                "packed": packed,
                "frame": len(frames),
            }
        )
        frames.append(_raw(data))
    return header, frames


def _int32() -> torch.dtype:
    import torch

    return torch.int32


def batch_from_frames(header: dict[str, Any], frames: Sequence[Frame]) -> RolloutBatch:
    import torch

    from rpeg.runtime.batch import RolloutBatch

    lens: dict[str, torch.Tensor] = {}
    for name in ("_r_lens", "_p_lens"):
        if name in header:
            fr = frames[header[name]]
            lens[name] = _from_raw(fr, torch.int32, [len(memoryview(fr)) // 4]).long()
    kw: dict[str, Any] = dict(header["scalars"])
    kw.update({k: list(v) for k, v in header["texts"].items()})
    for f in header["fields"]:
        dtype = getattr(torch, f["dtype"])
        fr = frames[f["frame"]]
        if f["packed"] is None:
            kw[f["name"]] = _from_raw(fr, dtype, f["shape"])
            continue
        key = "_r_lens" if f["packed"] == "right" else "_p_lens"
        n = int(lens[key].sum())
        flat = _from_raw(fr, dtype, [n])
        kw[f["name"]] = _unpack(flat, lens[key], f["shape"][1], f["packed"] == "left", dtype)
    return RolloutBatch(**kw)


def wire_bytes(b: RolloutBatch) -> int:
    """Bytes of tensor frames a batch puts on the wire (packed)."""
    _, frames = batch_to_frames(b)
    return sum(len(memoryview(f).cast("B")) for f in frames)


def register() -> None:
    """Register the serializers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch
    from distributed.protocol import dask_deserialize, dask_serialize

    from rpeg.runtime.batch import RolloutBatch

    dask_serialize.register(torch.Tensor)(tensor_to_frames)
    dask_deserialize.register(torch.Tensor)(tensor_from_frames)
    dask_serialize.register(torch.nn.Parameter)(tensor_to_frames)
    dask_deserialize.register(torch.nn.Parameter)(tensor_from_frames)
    dask_serialize.register(RolloutBatch)(batch_to_frames)
    dask_deserialize.register(RolloutBatch)(batch_from_frames)
    _REGISTERED = True


def dask_setup(worker: object = None) -> None:
    """The ``--preload`` hook of this module, which every worker recipe names
    (``rpeg.infra.cluster.PRELOAD``, the Slurm script, the Kubernetes manifest, docs/runtime.md)
    and the plugin sent to an attached scheduler runs: what a worker does when it starts,
    before any task -- these serializers, and the worker's own threads (event loop, task and
    offload threads) at one torch thread (:func:`rpeg.runtime.compute_thread.single_threaded`):
    the rank claims ``runtime.torch_threads`` on the thread that runs it, and no other thread
    opens an OpenMP team beside it."""
    from rpeg.runtime import compute_thread

    register()
    compute_thread.single_threaded()
