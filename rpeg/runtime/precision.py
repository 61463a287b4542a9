"""Mixed precision as verl and torchtitan do it: fp32 master weights, bf16 (or fp16) compute.

The rule, for every layout (docs/runtime.md "Precision"):

* A **trainable** role keeps its parameters, gradients and AdamW state in fp32
  (:data:`MASTER_DTYPE`). Its forward passes run under :func:`compute` --
  ``torch.autocast`` to the compute dtype, so matmuls (linears, attention) run in bf16
  and norms, softmaxes and the loss in fp32.
* FSDP2 units are built with :func:`fsdp_policy`: ``MixedPrecisionPolicy(param_dtype=compute,
  reduce_dtype=fp32)`` -- parameters all-gathered in bf16, gradients reduce-scattered in fp32,
  the sharded masters fp32 (torchtitan's default).
* Data-parallel replicas and tensor-parallel shards hold fp32 parameters, so their gradients
  are fp32 and are averaged over dp in fp32 (``Shards.sync_grads``).
* A **frozen** model -- the reference, a generator's own copy (lagging torch engine, an
  engine at another tensor-parallel size), an actor that only generates -- holds its
  weights in the compute dtype (:func:`frozen_dtype`); weight sync sends the compute dtype.
* fp16 compute overflows where bf16 does not: it trains with a dynamic loss scale
  (:class:`LossScaler`, ``torch.amp.GradScaler``'s rule); an overflowing step is skipped
  and the scale halved.

``compute_dtype == float32`` (the CPU default) changes nothing: no autocast, no casts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch

#: the dtype of trainable parameters, their gradients and optimizer state
MASTER_DTYPE = torch.float32


def is_reduced(dtype: torch.dtype) -> bool:
    """True for a compute dtype below fp32 (mixed precision on)."""
    return dtype in (torch.bfloat16, torch.float16)


def compute(device_type: str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The context of a forward pass in ``dtype``: ``torch.autocast`` on ``device_type``
    (CPU autocast runs bf16 and fp16 matmuls), a no-op for fp32."""
    if not is_reduced(dtype):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def frozen_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The storage dtype of a model that never trains: the compute dtype."""
    return compute_dtype


def fsdp_policy(compute_dtype: torch.dtype):
    """FSDP2's ``MixedPrecisionPolicy`` of ``compute_dtype`` (None for fp32: FSDP's default,
    everything in the parameters' dtype)."""
    if not is_reduced(compute_dtype):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def unscale_(params: Iterable[torch.nn.Parameter], inv_scale: float) -> None:
    """Multiply the gradients of ``params`` (plain tensors or DTensors: their local shards)
    by ``inv_scale`` in place. An inf or nan stays one, so the gradient norm still shows an
    overflow."""
    grads = [_local(p.grad).detach() for p in params if p.grad is not None]
    by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for g in grads:
        by_kind.setdefault((g.dtype, g.device), []).append(g)
    for same in by_kind.values():
        torch._foreach_mul_(same, inv_scale)


@dataclass
class LossScaler:
    """A dynamic loss scale (``torch.amp.GradScaler``'s rule, Micikevicius et al. 2018,
    arXiv:1710.03740): the loss is multiplied by :attr:`scale` before backward, the
    gradients divided by it before clipping; a step whose gradients are not finite is
    skipped and the scale multiplied by ``backoff``; after ``growth_interval`` finite steps
    in a row it is multiplied by ``growth``. Works on DTensor gradients (FSDP2, TP): only
    local shards are touched, and the finite check is the globally reduced gradient norm."""

    scale: float = 2.0**16
    growth: float = 2.0
    backoff: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0

    def update(self, finite: bool) -> None:
        if not finite:
            self.scale *= self.backoff
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])


def loss_scaler_for(compute_dtype: torch.dtype) -> LossScaler | None:
    """A :class:`LossScaler` for fp16 compute; None otherwise (bf16 has fp32's range)."""
    return LossScaler() if compute_dtype == torch.float16 else None
