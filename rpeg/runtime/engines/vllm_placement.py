"""Which GPU a rank's vLLM engine lands on.

vLLM's V1 engine runs in a child process (its engine core, and for ``tensor_parallel_size`` >
1 one worker per GPU) that takes the *first* GPUs it sees: its ``cuda:0`` .. ``cuda:tp-1``.
Under dask-cuda every worker already sees its own GPU first (rendezvous.py), so that is the
rank's GPU. Under plain Dask workers (a ``LocalCluster``, ``dask worker``) every worker sees
every GPU and a rank trains on ``cuda:i`` (its slot on the host, ``rendezvous.gpu_slots``):
without help its vLLM would land on GPU 0 with every other rank's.

:func:`engine_gpu` builds the engine with ``CUDA_VISIBLE_DEVICES`` rotated so that the rank's
GPU is the child's first (``visible_first``: the dask-cuda convention), and restores the
variable afterwards (this process's CUDA context is already made: the variable is read only
by the children started inside the block). The engine's weight updates then find the workers
on the rank's own GPU by UUID and take CUDA IPC (vllm_cuda_transfer). Not covered: vLLM's
in-process mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) puts its worker on this process's
``cuda:0`` whatever the variable says; RPEG builds engines in the default multiprocess mode.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from rpeg.errors import RpegError

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_first(index: int, visible: str | None, count: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child process whose ``cuda:0`` is this process's
    ``cuda:index``: this process's list (``visible``; None or empty: the ``count`` GPUs of the
    host, ``0..count-1``) rotated to start at ``index``, e.g. index 2 of ``None`` with 4 GPUs
    -> ``"2,3,0,1"``; index 1 of ``"4,5,6,7"`` -> ``"5,6,7,4"``. Entries may be UUIDs."""
    ids = [s.strip() for s in visible.split(",") if s.strip()] if visible else []
    if not ids:
        ids = [str(i) for i in range(count)]
    if not 0 <= index < len(ids):
        raise RpegError(
            f"vLLM engine placement: cuda:{index} is not one of this process's "
            f"{len(ids)} visible GPU(s) ({VISIBLE}={visible!r})"
        )
    return ",".join(ids[index:] + ids[:index])


@contextlib.contextmanager
def engine_gpu(device: torch.device | None, count: int | None = None) -> Iterator[None]:
    """Build a vLLM engine inside this block to put it on ``device`` (the rank's model's
    device). A CPU device, None or ``cuda:0`` changes nothing. ``count``: the visible GPUs
    (default ``torch.cuda.device_count()``)."""
    if device is None or device.type != "cuda" or not device.index:
        yield
        return
    n = torch.cuda.device_count() if count is None else count
    old = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = visible_first(device.index, old, n)
    try:
        with torch.cuda.device(device.index):
            yield
    finally:
        if old is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = old
