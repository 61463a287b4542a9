"""LoRA adapters in the performance model (``model.lora``; docs/lora.md): how many adapter
parameters a model gets, so a LoRA run's trainer is priced with the gradients and optimizer
state of the adapters only (the frozen base keeps its weights, no fp32 master, no moments);
under tensor parallelism the replicated factor's memory and its once-a-step gradient sum."""

from __future__ import annotations

from typing import Any

from rpeg.specs.models import ModelSpec

GB = 1e9


def module_dims(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each Linear kind of one decoder layer of a dense (GQA) model, by
    the names Llama/Qwen-style Hugging Face models give them. An MoE model's MLP kinds are
    per expert (counted for every expert: peft wraps each expert's Linear)."""
    h, q, kv = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim
    ffn = m.moe.expert_ffn_hidden if m.moe is not None else m.ffn_hidden
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, ffn),
        "up_proj": (h, ffn),
        "down_proj": (ffn, h),
    }


def lora_params(m: ModelSpec, rank: int, targets: tuple[str, ...]) -> float:
    """Adapter parameters of rank ``rank`` on ``targets``: r * (in + out) per wrapped Linear
    (A is r x in, B is out x r), every layer; MLP kinds once per expert of an MoE layer.
    Names this model has no Linear for count nothing."""
    return _per_target(m, targets, lambda t, i, o: rank * (i + o))


#: Linear kinds tensor parallelism splits column-wise (output features), as the runtime's
#: TP_PLAN does (rpeg.runtime.tensor_parallel; a test checks they agree): their adapter's A
#: ([r, in]) is replicated on every tp rank; the row-wise rest (o, down) replicates B
COLUMN_WISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def replicated_lora_params(m: ModelSpec, rank: int, targets: tuple[str, ...]) -> float:
    """The adapter parameters a tensor-parallel layout replicates instead of splitting
    (rpeg.runtime.lora_tp): A (r x in) of a column-wise target, B (out x r) of a row-wise
    one, every layer; MLP kinds once per expert."""
    return _per_target(m, targets, lambda t, i, o: rank * (i if t in COLUMN_WISE else o))


def _per_target(m: ModelSpec, targets: tuple[str, ...], count) -> float:
    """``count(target, in, out)`` summed over the targets this model has a Linear for, once
    per expert for MLP kinds of an MoE layer, over every layer."""
    dims = module_dims(m)
    experts = m.moe.experts if m.moe is not None else 1
    per_layer = 0
    for t in targets:
        if t in dims:
            i, o = dims[t]
            per_layer += count(t, i, o) * (
                experts if t in ("gate_proj", "up_proj", "down_proj") else 1
            )
    return float(per_layer * m.layers)


def trainable_params(m: ModelSpec, wl: Any, p_dev: float, tp: int = 1) -> float:
    """Trained parameters of the ``p_dev`` a device holds: all of them, or with LoRA
    (``wl.lora_rank``) the adapters' share of them -- split like their base, but for the
    factor each tp rank holds whole (:func:`replicated_lora_params`: ``tp`` times its share)."""
    if wl.lora_rank is None:
        return p_dev
    total = lora_params(m, wl.lora_rank, wl.lora_targets)
    rep = replicated_lora_params(m, wl.lora_rank, wl.lora_targets) if tp > 1 else 0.0
    return p_dev * (total + (tp - 1) * rep) / m.params


def tp_grad_sum_bytes(m: ModelSpec, wl: Any, p_dev: float, tp: int) -> float:
    """Bytes one tp rank all-reduces once per optimizer step under LoRA: the replicated
    factors' partial gradients (bf16, as the trainer's gradients are priced), summed over tp
    (tensor_parallel.sum_partial_grads); 0 without LoRA or tp."""
    if wl.lora_rank is None or tp <= 1:
        return 0.0
    rep = replicated_lora_params(m, wl.lora_rank, wl.lora_targets)
    return p_dev * tp * rep / m.params * 2.0


def adapter_memory(
    m: ModelSpec, wl: Any, p_dev: float, wbytes: float, shards: int, tp: int = 1
) -> dict[str, float]:
    """``{"lora_adapters": GB}`` per device: the adapters' weights beside the frozen base (in
    the weights' dtype, over ``shards`` FSDP shards); nothing without LoRA."""
    if wl.lora_rank is None:
        return {}
    return {"lora_adapters": trainable_params(m, wl, p_dev, tp) * wbytes / GB / shards}
