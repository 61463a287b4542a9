"""LoRA adapters under tensor parallelism (``model.lora`` at tp > 1; docs/lora.md "Tensor
parallelism").

A peft LoRA layer on a split target (:data:`rpeg.runtime.model_io.architectures.TP_PLAN`) is split
with it, Megatron-style (the split peft's ``LoraParallelLinear`` gives Megatron-LM's parallel
linears, ``peft/tuners/lora/tp_layer.py``): the adapter factor on the base's split side is
split the same way, the other factor (``r`` wide: small) is replicated. rpeg.runtime.lora's
``apply_lora`` gives every injected layer the class :class:`LoraLinear` (peft's forward), whose
``split_for_tp`` ``apply_tensor_parallel`` calls for a wrapped target.

* column-wise target (q/k/v, gate/up; base ``W`` ``Shard(0)``, output features local):
  ``A`` [r, in] ``Replicate()``, ``B`` [out, r] ``Shard(0)``. Each rank computes
  ``W_i x + s B_i (A x)`` on the replicated input: its local output features.
* row-wise target (o, down; base ``W`` ``Shard(1)``, input features local, partial outputs
  summed): ``A`` ``Shard(1)``, ``B`` ``Replicate()``. Each rank computes the partial
  ``W_i x_i + s B (A_i x_i)`` and ONE sum over tp gives ``W x + s B (A x)`` (``B`` is linear
  and replicated, so the adapter's term joins the base's sum; no extra collective, forward
  or decode).

Gradients: the replicated factor's gradient is partial on each rank (the column-wise ``A``
sees the partial ``B_i^T dy_i``; the row-wise ``B`` sees the partial ``A_i x_i``). Summing it
is linear, so it is left partial through every micro-batch's backward and summed once per
optimizer step (the factor is marked :data:`~rpeg.runtime.tensor_parallel.PARTIAL_GRAD`;
``Shards.sync_grads`` runs :func:`~rpeg.runtime.tensor_parallel.sum_partial_grads`: one
all-reduce of all of them, before the gradient norm), after which it is identical on every
rank as its ``Replicate()`` placement says. Summing in backward instead -- Megatron's ``f``
on the weight, one all-reduce per factor per micro-batch, 56 per step here -- made the tp=2
train step of a 2-layer LoRA policy on all seven kinds (rank 16, 4 micro-batches) 0.17-0.31 s
against 0.067-0.14 s with the one sum (medians of 10 steps, two A/B rounds, loaded 2-core
machine, 2026-12-02 22:41 UTC). Code reading these gradients between a backward and
``Shards.sync_grads`` sees the rank's shares (the trainer reads them after). The column-wise
input gradient stays partial on both paths (``W_i^T dy_i + A^T s B_i^T dy_i``) and is summed once, by the norm's
:class:`~rpeg.runtime.tensor_parallel.CopyToTPHook` or -- for a target no norm hook feeds --
by this layer's own copy of ``x``, shared by the base and the adapter paths.

Dropout (``model.lora.dropout`` > 0) draws from each rank's generator: the column-wise layer
drops the replicated input on every rank, the row-wise one its local input features, so the
masks are not those of one process (equality with one process holds at dropout 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear as PeftLinear
from torch import nn

from rpeg.runtime.tensor_parallel import (
    PARTIAL_GRAD,
    STYLES,
    CopyToTP,
    SumOverTP,
    local_shard,
    local_tensor,
    shard_linear,
    tp_all_reduce,
    tp_group_of,
)

#: style -> (A's placement, B's placement) as torch placement names (Shard dim or replicate)
ADAPTER_PLACEMENTS = {"colwise": ("replicate", "shard0"), "rowwise": ("shard1", "replicate")}


def splittable(model: nn.Module) -> nn.Module:
    """Give each of ``model``'s peft LoRA Linear layers the class :class:`LoraLinear` (peft's,
    plus ``split_for_tp``, which ``apply_tensor_parallel`` calls); in place, returns it."""
    for m in model.modules():
        if type(m) is PeftLinear:
            m.__class__ = LoraLinear
    return model


def _placement(name: str):
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate()] if name == "replicate" else [Shard(int(name[-1]))]


def _refuse(layer: nn.Module, where: str) -> None:
    """What this split does not do, by name (none of it is reachable from ``model.lora``)."""
    if type(layer) not in (PeftLinear, LoraLinear):
        raise TypeError(
            f"LoRA under tensor parallelism: {where} is a {type(layer).__name__}; only peft's "
            "lora.Linear over an nn.Linear is split"
        )
    if type(layer.base_layer) is not nn.Linear:
        raise TypeError(
            f"LoRA under tensor parallelism: {where}.base_layer is a "
            f"{type(layer.base_layer).__name__}, not an nn.Linear"
        )
    if layer.merged:
        raise ValueError(f"LoRA under tensor parallelism: {where} has merged adapters")
    variants = [a for a in layer.lora_A if a in getattr(layer, "lora_variant", {})]
    biased = [a for a in layer.lora_B if layer.lora_B[a].bias is not None]
    if variants or biased:
        raise ValueError(
            f"LoRA under tensor parallelism: {where} has adapters {variants or biased} with "
            "DoRA/variants or a lora_B bias; plain LoRA only"
        )


def shard_lora_linear(layer: nn.Module, style: str, tp_mesh, where: str = "layer") -> None:
    """Split the peft LoRA wrapper ``layer`` (in place) over the 1-D ``tp_mesh``: its base
    layer as :func:`rpeg.runtime.tensor_parallel.shard_linear` does, each adapter's A and B
    as DTensors with :data:`ADAPTER_PLACEMENTS` (rank 0's values, scattered), and its class
    :class:`ColwiseLoraLinear` / :class:`RowwiseLoraLinear`. The replicated factor is marked
    :data:`~rpeg.runtime.tensor_parallel.PARTIAL_GRAD` (its gradient summed per step)."""
    from torch.distributed.tensor import distribute_tensor

    if style not in STYLES:
        raise ValueError(f"tensor-parallel style {style!r}: allowed {', '.join(STYLES)}")
    _refuse(layer, where)
    shard_linear(layer.base_layer, style, tp_mesh)
    a_place, b_place = ADAPTER_PLACEMENTS[style]
    for mods, place in ((layer.lora_A, a_place), (layer.lora_B, b_place)):
        for sub in mods.values():
            p = sub.weight
            d = distribute_tensor(p.detach(), tp_mesh, _placement(place))
            sub.register_parameter("weight", nn.Parameter(d, requires_grad=p.requires_grad))
            if place == "replicate":  # each rank computes its share of the gradient
                setattr(sub, PARTIAL_GRAD, True)
    layer.__class__ = ColwiseLoraLinear if style == "colwise" else RowwiseLoraLinear


class LoraLinear(PeftLinear):
    """peft's LoRA Linear (same forward) that tensor parallelism can split: what
    rpeg.runtime.lora.apply_lora injects (:func:`splittable`)."""

    def split_for_tp(self, style: str, tp_mesh, where: str = "layer") -> None:
        shard_lora_linear(self, style, tp_mesh, where)


def _adapters(layer: PeftLinear) -> list[str]:
    if layer.disable_adapters:
        return []
    return [a for a in layer.active_adapters if a in layer.lora_A]


def _weight(p: torch.Tensor, grad: bool) -> torch.Tensor:
    """The rank's part of a DTensor weight for a local matmul (differentiable with ``grad``)."""
    return local_shard(p) if grad else local_tensor(p)


class ColwiseLoraLinear(LoraLinear):
    """A peft LoRA layer over a :class:`~rpeg.runtime.tensor_parallel.ColwiseLinear`: the
    local output features ``W_i x + b_i + s B_i (A x)``; A's gradient partial until summed."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        base = self.base_layer
        names = _adapters(self)
        if not names:
            return base(x)
        grad = torch.is_grad_enabled()
        if grad and not base.input_copied:  # one copy for the base and the adapter paths
            x = CopyToTP.apply(x, tp_group_of(base.weight))
        w, b = (
            (local_shard(base.weight), local_shard(base.bias))
            if grad
            else (
                local_tensor(base.weight),
                local_tensor(base.bias),
            )
        )
        y = F.linear(x, w, b)
        dtype = y.dtype
        for name in names:
            a = _weight(self.lora_A[name].weight, grad)
            bb = _weight(self.lora_B[name].weight, grad)
            h = F.linear(self.lora_dropout[name](self._cast_input_dtype(x, a.dtype)), a)
            y = y + F.linear(h, bb) * self.scaling[name]
        return y.to(dtype)


class RowwiseLoraLinear(LoraLinear):
    """A peft LoRA layer over a :class:`~rpeg.runtime.tensor_parallel.RowwiseLinear`: the
    partial ``W_i x_i + s B (A_i x_i)`` summed over tp once, then the bias; B's gradient
    partial until summed."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        base = self.base_layer
        names = _adapters(self)
        if not names:
            return base(x)
        grad = torch.is_grad_enabled()
        group = tp_group_of(base.weight)
        y = F.linear(x, local_shard(base.weight) if grad else local_tensor(base.weight))
        for name in names:
            a = _weight(self.lora_A[name].weight, grad)
            bb = _weight(self.lora_B[name].weight, grad)
            h = F.linear(self.lora_dropout[name](self._cast_input_dtype(x, a.dtype)), a)
            y = y + (F.linear(h, bb) * self.scaling[name]).to(y.dtype)
        y = SumOverTP.apply(y, group) if grad else tp_all_reduce(y, group)
        if base.bias is None:
            return y
        return y + (local_shard(base.bias) if grad else local_tensor(base.bias))
