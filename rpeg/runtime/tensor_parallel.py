"""Tensor parallelism with plain local matmuls over DTensor parameters.

Megatron-LM's split of a decoder block (Shoeybi et al. 2019, arXiv:1909.08053): q/k/v and
gate/up are split by output features (column-wise), o and down by input features
(row-wise), so attention runs ``heads / tp`` heads and the MLP ``ffn / tp`` channels per
rank, and each block needs one sum over the tp ranks after o and one after down.

* Parameters are DTensors on the tp mesh with the placements torch's ``ColwiseParallel`` /
  ``RowwiseParallel`` give them -- ``Shard(0)`` for column-wise weights and biases,
  ``Shard(1)`` for row-wise weights, ``Replicate()`` for row-wise biases -- so FSDP2
  composes over them (2-D parameters), ``torch.distributed.checkpoint`` saves and reloads
  them in any other layout, and ``full_tensor()`` gathers them.
* Activations stay plain tensors. A column-wise linear is ``F.linear(x, W.to_local(),
  b.to_local())`` on the replicated input; a row-wise one multiplies the local input shard
  and sums the partial outputs over tp (:class:`SumOverTP`: an all-reduce forward, identity
  backward); the replicated input of a column-wise linear gets its gradient summed over tp
  in backward (:class:`CopyToTP`: Megatron's ``f``; ``SumOverTP`` is its ``g``).

Why not ``parallelize_module``: its styles wrap every activation in a DTensor and run each
op through DTensor's sharding propagation and functional collectives. At ``rpeg-tiny``'s
shape on this CPU (one decode forward of 64 rows, two gloo ranks) that was 28 ms per
forward against 7.8 ms for the whole model in one process; the plain split here is
10.7-17.7 ms (docs/measurements.md; docs/parallelism.md "Shards").

:func:`tp_all_reduce` is the sum: ``dist.all_reduce`` on NCCL and on groups larger than two;
on a gloo pair, one exchange and a local add (:func:`rpeg.runtime.parallel.pair_sum_`: over
the pair channel's shared memory on one host, else one gloo ``isend``/``recv``; gloo's
``all_reduce`` came back after a scheduler tick in a third of small calls here); both ranks
compute ``own + other`` and IEEE addition commutes, so the two results are bit-identical.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rpeg.runtime.model_io.architectures import TP_PLAN, decoder_layers, pretrained_model

#: the Linear classes this module swaps in, by style name
STYLES = ("colwise", "rowwise")


def tp_all_reduce(t: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum ``t`` (contiguous) over ``group`` in place and return it."""
    import torch.distributed as dist

    from rpeg.runtime.parallel import pair_sum_

    if dist.get_world_size(group) == 1 or pair_sum_(t, group):
        return t
    dist.all_reduce(t, group=group)
    return t


class SumOverTP(torch.autograd.Function):
    """Forward: the sum of the partial outputs over tp; backward: the gradient as it is."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, group: Any) -> torch.Tensor:
        if not y.is_contiguous():
            return tp_all_reduce(y.contiguous(), group)
        ctx.mark_dirty(y)  # summed in place: the linear's fresh output, saved by no backward
        return tp_all_reduce(y, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class CopyToTP(torch.autograd.Function):
    """Forward: the replicated input as it is; backward: its gradient summed over tp."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return tp_all_reduce(grad.contiguous().clone(), ctx.group), None


#: attribute set on a module whose ``weight`` is replicated over tp while each rank computes
#: only its share of that weight's gradient (a LoRA factor beside a split one,
#: rpeg.runtime.lora_tp): the gradients accumulate partial and :func:`sum_partial_grads`
#: (``Shards.sync_grads``, once per optimizer step) sums them over tp
PARTIAL_GRAD = "tp_partial_grad"


def partial_grad_modules(module: nn.Module) -> list[nn.Module]:
    """The submodules of ``module`` marked :data:`PARTIAL_GRAD`, in module order."""
    return [m for m in module.modules() if getattr(m, PARTIAL_GRAD, False)]


def sum_partial_grads(module: nn.Module | None) -> None:
    """Sum the accumulated ``weight`` gradients of ``module``'s :func:`partial_grad_modules`
    over their tp group, in place: one :func:`tp_all_reduce` of their local shards flattened
    per (group, dtype), not one per weight per backward. Every rank of the group calls it
    (``Shards.sync_grads``, before the gradient norm); None: nothing to sum."""
    if module is None:
        return
    buckets: dict[tuple[int, torch.dtype], tuple[Any, list[torch.Tensor]]] = {}
    for m in partial_grad_modules(module):
        g = m.weight.grad
        if g is None:
            continue
        group = getattr(m, TP_GROUP_ATTR, None) or tp_group_of(m.weight)
        local = local_tensor(g)
        buckets.setdefault((id(group), local.dtype), (group, []))[1].append(local)
    for group, grads in buckets.values():
        flat = tp_all_reduce(torch.cat([t.reshape(-1) for t in grads]), group)
        a = 0
        for t in grads:
            t.copy_(flat[a : a + t.numel()].view_as(t))
            a += t.numel()


def local_shard(p: torch.Tensor | None) -> torch.Tensor | None:
    """The rank's shard of a DTensor parameter (differentiable), or a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return _LocalShard.apply(p) if isinstance(p, DTensor) else p


class _LocalShard(torch.autograd.Function):
    """What ``DTensor.to_local()`` gives (the rank's shard, differentiable), with a cheaper
    backward: the gradient's DTensor takes the parameter's spec (same placements; its local
    strides checked equal) instead of recomputing the global shape and strides and entering
    autograd again through ``DTensor.from_local``. Measured at rpeg-tiny, tp=2, 32 rows x 14
    tokens per optimizer step: 88.8 -> 85.5 ms of CPU per rank."""

    @staticmethod
    def forward(ctx, p):
        t = p._local_tensor
        ctx.spec, ctx.stride = p._spec, t.stride()
        ctx.set_materialize_grads(False)
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        from torch.distributed.tensor import DTensor

        if grad is None:
            return None
        spec = ctx.spec
        if grad.stride() != ctx.stride:
            grad = grad.contiguous()
        if grad.stride() != ctx.stride:  # a layout the spec does not describe: the long way
            return DTensor.from_local(
                grad, spec.mesh, spec.placements, shape=spec.shape, stride=spec.stride
            )
        return DTensor(grad, copy.copy(spec), requires_grad=False)


def local_tensor(p: torch.Tensor | None) -> torch.Tensor | None:
    """The rank's shard of a DTensor parameter without autograd (for no-grad forwards)."""
    from torch.distributed.tensor import DTensor

    return p._local_tensor if isinstance(p, DTensor) else p


def tp_group_of(weight: torch.Tensor) -> Any:
    """The tp process group of a parameter (its DTensor mesh; 2-D ``(dp, tp)``: the tp dim)."""
    mesh = weight.device_mesh
    return mesh.get_group("tp") if mesh.ndim > 1 else mesh.get_group()


class ColwiseLinear(nn.Linear):
    """``nn.Linear`` whose weight and bias are ``Shard(0)`` DTensors: local output features.
    ``input_copied``: its input already went through :class:`CopyToTP` (a
    :class:`CopyToTPHook` on the norm that feeds it and its siblings)."""

    input_copied = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # decode, log-probs: no autograd functions to run
            return F.linear(x, local_tensor(self.weight), local_tensor(self.bias))
        if not self.input_copied:
            x = CopyToTP.apply(x, tp_group_of(self.weight))
        return F.linear(x, local_shard(self.weight), local_shard(self.bias))


class CopyToTPHook:
    """Forward hook of a norm whose output feeds several column-wise linears (q/k/v after
    ``input_layernorm``, gate/up after ``post_attention_layernorm``): applies
    :class:`CopyToTP` once to that output, so backward sums the consumers' partial input
    gradients in one all-reduce instead of one per linear (2 per block instead of 5).
    ``linear``: one of the consumers (its weight's mesh names the group)."""

    def __init__(self, linear: ColwiseLinear):
        self.linear = linear

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return output  # f is the identity forward; only its backward sums
        return CopyToTP.apply(output, tp_group_of(self.linear.weight))


def copy_once_after(norm: nn.Module, consumers: list[nn.Module]) -> None:
    """Let ``norm``'s output be the one copy into the tp region for ``consumers`` (column-wise
    linears that read only that output, or LoRA layers over them: their ``base_layer``)."""
    linears = [getattr(c, "base_layer", c) for c in consumers]
    if not linears or not all(isinstance(c, ColwiseLinear) for c in linears):
        raise TypeError("copy_once_after needs column-wise linears (shard_linear them first)")
    norm.register_forward_hook(CopyToTPHook(linears[0]))
    for c in linears:
        c.input_copied = True


class RowwiseLinear(nn.Linear):
    """``nn.Linear`` whose weight is a ``Shard(1)`` DTensor (local input features) and bias a
    ``Replicate()`` one: partial outputs summed over tp, then the bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            y = tp_all_reduce(F.linear(x, local_tensor(self.weight)), tp_group_of(self.weight))
            return y if self.bias is None else y + local_tensor(self.bias)
        y = SumOverTP.apply(F.linear(x, local_shard(self.weight)), tp_group_of(self.weight))
        return y if self.bias is None else y + local_shard(self.bias)


def shard_linear(linear: nn.Linear, style: str, tp_mesh) -> None:
    """Turn ``linear`` (in place) into the ``style`` ("colwise" / "rowwise") split over the
    1-D ``tp_mesh``: its parameters become DTensors (rank 0's values, scattered) and its class
    :class:`ColwiseLinear` / :class:`RowwiseLinear`."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if style not in STYLES:
        raise ValueError(f"tensor-parallel style {style!r}: allowed {', '.join(STYLES)}")
    if type(linear) is not nn.Linear:
        raise TypeError(f"shard_linear needs an nn.Linear, got {type(linear).__name__}")
    placements = {
        "colwise": {"weight": [Shard(0)], "bias": [Shard(0)]},
        "rowwise": {"weight": [Shard(1)], "bias": [Replicate()]},
    }[style]
    for name, p in list(linear.named_parameters(recurse=False)):
        d = distribute_tensor(p.detach(), tp_mesh, placements[name])
        linear.register_parameter(name, nn.Parameter(d, requires_grad=p.requires_grad))
    linear.__class__ = ColwiseLinear if style == "colwise" else RowwiseLinear


#: norm of a decoder block -> the column-wise linears that read only its output (HF Llama /
#: Qwen2 / Qwen3): their input gradient is summed over tp once (rpeg.runtime.tensor_parallel)
TP_SHARED_INPUTS: dict[str, tuple[str, ...]] = {
    "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
}
#: the model types whose blocks read as :data:`TP_SHARED_INPUTS` says (pre-norm: the MLP reads
#: ``post_attention_layernorm``'s output). Elsewhere the same names mean other wiring (Gemma 3
#: and OLMo 2 normalise the attention's *output* with ``post_attention_layernorm``), so each
#: column-wise linear sums its own input gradient (one all-reduce each: slower, always right)
TP_SHARED_INPUT_TYPES = ("llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mixtral")

#: attribute holding the tp process group of a :data:`PARTIAL_GRAD` module whose weight is a
#: plain (or dp-only) tensor: a per-head norm the plan keeps whole
#: (``replicated_with_grad_allreduce``)
TP_GROUP_ATTR = "tp_group"


def apply_tensor_parallel(module: nn.Module, tp_mesh) -> None:
    """Split every decoder block of ``module`` over the 1-D ``tp_mesh`` (in place) as the
    model's own tensor-parallel plan says (``base_model_tp_plan``; the hand-written
    :data:`TP_PLAN` for a config without one): its ``colwise`` / ``rowwise`` linears become
    :mod:`rpeg.runtime.tensor_parallel` column/row-wise linears (DTensor parameters, plain
    activations), its ``replicated_with_grad_allreduce`` modules (per-head q/k norms) stay
    whole with their gradients summed over tp (:func:`sum_partial_grads`). A model the
    runtime cannot split (rpeg.runtime.model_io.architectures.tp_problems) is refused by
    name. A wrapped target splits itself with its ``split_for_tp(style, tp_mesh, where=...)``
    (a LoRA layer: rpeg.runtime.lora_tp)."""
    if tp_mesh.size() == 1:
        return
    from rpeg.errors import ConfigError
    from rpeg.runtime.model_io.architectures import RUN_STYLES, layer_tp_plan, tp_problems

    lm = pretrained_model(module)
    cfg = getattr(lm, "config", None)
    if cfg is not None:
        probs = tp_problems(cfg, tp_mesh.size())
        if probs:
            raise ConfigError(probs, title="the layout does not divide the model")
        plan = {n: RUN_STYLES[s] for n, s in layer_tp_plan(cfg)[0].items()}
    else:
        plan = dict(TP_PLAN)
    group = None  # the tp process group, for the modules kept whole (got when first needed)
    shared_inputs = (
        TP_SHARED_INPUTS if getattr(cfg, "model_type", "llama") in TP_SHARED_INPUT_TYPES else {}
    )
    for i, layer in enumerate(decoder_layers(module)):
        for name, style in plan.items():
            if not _has(layer, name):
                continue
            target, where = layer.get_submodule(name), f"layers.{i}.{name}"
            if style == "replicated":
                group = group if group is not None else tp_mesh.get_group()
                setattr(target, PARTIAL_GRAD, True)
                setattr(target, TP_GROUP_ATTR, group)
                continue
            split = getattr(target, "split_for_tp", None)  # a wrapper that splits itself
            if split is not None:
                split(style, tp_mesh, where=where)
            elif hasattr(target, "base_layer"):
                raise TypeError(
                    f"{where} is a {type(target).__name__} wrapper that cannot split itself "
                    "(a peft LoRA model not built by rpeg.runtime.lora.apply_lora?)"
                )
            else:
                shard_linear(target, style, tp_mesh)
        for norm, consumers in shared_inputs.items():
            if _has(layer, norm) and all(_has(layer, c) for c in consumers):
                linears = [
                    getattr(layer.get_submodule(c), "base_layer", None) or layer.get_submodule(c)
                    for c in consumers
                ]
                if all(isinstance(c, ColwiseLinear) for c in linears):
                    copy_once_after(
                        layer.get_submodule(norm), [layer.get_submodule(c) for c in consumers]
                    )


def _has(module: nn.Module, dotted: str) -> bool:
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True
