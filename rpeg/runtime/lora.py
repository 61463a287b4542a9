"""LoRA adapters on the policy (``model.lora``; docs/lora.md), through ``peft``.

The adapters are injected into the causal LM in place (``peft.inject_adapter_in_model``: the
model keeps its own class, forward and decoder layers, so the engines, the log-prob head and
FSDP see the same model); peft freezes every base parameter, so the actor's optimizer (built
over the parameters that require gradients) holds the adapters only. What leaves the role:

* weight sync and :func:`merged_state_dict`: the merged weights ``W + scale * B @ A`` under the
  base model's own parameter names (engines -- the torch engine, vLLM -- are unchanged);
* checkpoints (:func:`adapter_keys`): the adapter tensors only (the frozen base is rebuilt from
  its source on resume, as the frozen reference is);
* ``rpeg export``: peft's adapter folder and the merged model (rpeg.runtime.export).

Under tensor parallelism the adapters are split with their targets (rpeg.runtime.lora_tp);
the merged weights and the adapter state gather them as they gather the base (``_full``).

The reference of a LoRA run is the base model: a separate frozen copy taken before the adapters
are injected (equal to the LoRA model with its adapters disabled, :func:`adapters_disabled`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from rpeg.config import LoraSection
from rpeg.errors import ConfigError, Problem

#: the adapter name peft gives a single adapter (state-dict keys ``...lora_A.default.weight``)
ADAPTER = "default"
#: what peft inserts into a wrapped layer's parameter names
_BASE = ".base_layer."
_ADAPTER_MARKS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")


def peft_config(section: LoraSection):
    """peft's ``LoraConfig`` of ``model.lora`` (causal LM, no bias)."""
    from peft import LoraConfig

    return LoraConfig(
        r=section.rank,
        lora_alpha=section.alpha,
        target_modules=list(section.target_modules),
        lora_dropout=section.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )


def linear_names(model: nn.Module) -> list[str]:
    """The last name parts of ``model``'s ``nn.Linear`` layers (what target_modules names),
    but the LM head's (its log-probs are computed by rpeg's own head, model_io.logprobs)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return sorted(
        {
            n.rsplit(".", 1)[-1]
            for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and m is not head
        }
    )


def check_targets(model: nn.Module, section: LoraSection) -> None:
    """A named error when a target module is not a Linear layer of ``model``."""
    have = linear_names(model)
    unknown = [t for t in section.target_modules if t not in have]
    if unknown:
        raise ConfigError(
            [
                Problem(
                    "model.lora.target_modules",
                    f"{unknown} are not Linear layers of the model (allowed: {', '.join(have)})",
                )
            ]
        )


def apply_lora(model: nn.Module, section: LoraSection, seed: int = 0) -> nn.Module:
    """Inject ``section``'s adapters into ``model`` in place (B starts at zero: the model's
    outputs are unchanged) and freeze every other parameter; returns ``model``. The adapters'
    initial values are :func:`adapter_init`'s for ``seed`` (a model on the meta device gets
    them when it is filled: :func:`lora_fetch`)."""
    from peft import inject_adapter_in_model

    from rpeg.runtime.lora_tp import splittable

    check_targets(model, section)
    dtype = next(model.parameters()).dtype
    model = inject_adapter_in_model(peft_config(section), model, adapter_name=ADAPTER)
    splittable(model)  # a tensor-parallel layout splits the adapters with their targets
    with torch.no_grad():
        for n, p in model.named_parameters():
            if is_adapter_key(n):
                p.data = p.data.to(dtype)
                if p.device.type != "meta":
                    p.copy_(adapter_init(n, tuple(p.shape), seed))
    return model


def adapter_init(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial full value of adapter tensor ``name``: B (and embedding A) zeros, A peft's
    default (Kaiming-uniform with a = sqrt(5): uniform in +-1/sqrt(fan_in)) drawn from a
    generator seeded by ``seed`` and the name, so a whole model and one built shard by shard
    on the meta device start from the same adapters on every rank."""
    import zlib

    if ".lora_A." not in name:
        return torch.zeros(shape)
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    bound = 1.0 / math.sqrt(shape[-1])
    return torch.empty(shape).uniform_(-bound, bound, generator=g)


def lora_fetch(fetch: Callable[[str], torch.Tensor | None], seed: int, model: nn.Module):
    """``fetch`` of a base model's full tensors, for ``model``: the same model with adapters
    injected (rpeg.runtime.materialize fills a meta LoRA model through it). A wrapped layer's
    ``...base_layer.weight`` is the base's ``...weight``; an adapter tensor is its
    :func:`adapter_init` value at its full shape."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if is_adapter_key(k)}

    def get(name: str) -> torch.Tensor | None:
        if name in shapes:
            return adapter_init(name, shapes[name], seed)
        return fetch(base_name(name))

    return get


def has_lora(model: nn.Module) -> bool:
    return any(is_adapter_key(n) for n, _ in model.named_parameters())


def is_adapter_key(name: str) -> bool:
    return any(m in name for m in _ADAPTER_MARKS)


def base_name(name: str) -> str:
    """A wrapped layer's parameter name as the base model names it."""
    return name.replace(_BASE, ".")


def adapter_keys(state: Mapping[str, object]) -> list[str]:
    """The adapter entries of a state dict (what a LoRA checkpoint holds)."""
    return [k for k in state if is_adapter_key(k)]


def lora_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, layer) of every peft LoRA layer of ``model``."""
    from peft.tuners.lora import LoraLayer

    for n, m in model.named_modules():
        if isinstance(m, LoraLayer):
            yield n, m


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def merged_tensor_source(model: nn.Module, dtype: torch.dtype | None = None):
    """``(meta, fetch)`` like :func:`rpeg.runtime.sharding.full_tensor_source`, over the base
    model's names: a LoRA layer's weight is fetched merged, ``W + scale * B @ A`` (computed in
    the weight's dtype, then cast), the adapters themselves are left out. Sharded: every rank
    fetches the same names in the same order (each fetch gathers W, A and B)."""
    state = model.state_dict()
    merged: dict[str, tuple[str, str, float]] = {}  # base weight key -> (A key, B key, scale)
    for name, layer in lora_layers(model):
        for adapter in layer.active_adapters:
            w = f"{name}.base_layer.weight"
            merged[w] = (
                f"{name}.lora_A.{adapter}.weight",
                f"{name}.lora_B.{adapter}.weight",
                float(layer.scaling[adapter]),
            )

    def target(v: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and v.is_floating_point() else v.dtype

    keys = {base_name(k): k for k in state if not is_adapter_key(k)}
    meta = {b: (tuple(state[k].shape), target(state[k])) for b, k in keys.items()}

    def fetch(name: str) -> torch.Tensor:
        k = keys[name]
        v = _full(state[k])
        if k in merged:
            a, b, scale = merged[k]
            v = v + scale * (_full(state[b]).to(v.dtype) @ _full(state[a]).to(v.dtype))
        return v.to(target(v))

    return meta, fetch


def merged_state_dict(
    model: nn.Module, dtype: torch.dtype | None = None, *, keep_device: bool = False
) -> dict[str, torch.Tensor]:
    """The merged full weights under the base names (detached CPU copies unless
    ``keep_device``); a collective when sharded."""
    meta, fetch = merged_tensor_source(model, dtype)
    out = {}
    for k in meta:
        v = fetch(k)
        out[k] = v.detach() if keep_device and v.device.type != "cpu" else v.detach().cpu().clone()
    return out


def adapter_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``module`` (full, on CPU) plus every other trainable parameter
    (a shared value head): what a LoRA checkpoint holds. A collective when sharded."""
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    return {
        k: _full(v).cpu().clone()
        for k, v in module.state_dict().items()
        if is_adapter_key(k) or k in trainable
    }


def load_adapter_state(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state` into ``module`` (sharded or not): every key must be one of its
    adapter or trainable entries, and every adapter entry must be given."""
    from rpeg.runtime.sharding import load_full_state_dict

    own = adapter_state_names(module)
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise KeyError(
            f"LoRA checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]} "
            "(was it written with the same model.lora?)"
        )

    class _View(nn.Module):  # load_full_state_dict over the adapter entries only
        def state_dict(self, *a, **k):
            return {n: v for n, v in module.state_dict().items() if n in own}

    load_full_state_dict(_View(), state)


def adapter_state_names(module: nn.Module) -> set[str]:
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    return {k for k in module.state_dict() if is_adapter_key(k) or k in trainable}


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """While inside, ``model``'s LoRA layers compute the base layers alone (peft's
    ``disable_adapter`` for a model with injected adapters)."""
    layers = [m for _, m in lora_layers(model)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)  # the adapters require gradients again, as before


def strip_adapters(model: nn.Module) -> nn.Module:
    """``model`` with every LoRA layer replaced by its base layer (unmerged: the base weights
    as they are) and every parameter trainable again; in place."""
    for name, layer in list(lora_layers(model)):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.get_base_layer())
    model.requires_grad_(True)
    return model


def param_counts(model: nn.Module) -> tuple[int, int]:
    """(adapter parameters, all parameters) of ``model`` (tied parameters once)."""
    seen: set[int] = set()
    adapters = total = 0
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        adapters += p.numel() if is_adapter_key(n) else 0
    return adapters, total


def base_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` without its adapters (the base weights, unmerged)."""
    import copy

    return strip_adapters(copy.deepcopy(model)) if has_lora(model) else copy.deepcopy(model)


def sync_state(
    lm: nn.Module, dtype: torch.dtype | None = None, keep_device: bool = False
) -> dict[str, torch.Tensor]:
    """What weight sync sends of ``lm``: its full weights, merged under the base names when it
    holds adapters (rpeg.runtime.sharding.full_state_dict otherwise)."""
    if has_lora(lm):
        return merged_state_dict(lm, dtype, keep_device=keep_device)
    from rpeg.runtime.sharding import full_state_dict

    return full_state_dict(lm, dtype=dtype, keep_device=keep_device)


def sync_source(lm: nn.Module, dtype: torch.dtype | None = None):
    """``(meta, fetch)`` of :func:`sync_state` one tensor at a time (weight sync's buckets)."""
    if has_lora(lm):
        return merged_tensor_source(lm, dtype)
    from rpeg.runtime.sharding import full_tensor_source

    return full_tensor_source(lm, dtype)
