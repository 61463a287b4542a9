"""Sharded construction: a rank never holds the whole model of a sharded role.

A role whose layout shards it (tensor parallelism, or FSDP2 over dp > 1) is built on the
``meta`` device (shapes and dtypes, no storage), laid out there (TP, ``fully_shard`` per
block: rpeg.runtime.sharding.shard_roles), and only then given storage on the rank's device
(``to_empty``): each parameter is allocated at its local shard's size. The shard is then
filled from a :class:`WeightSource`, one full tensor at a time: the rank reads a tensor,
keeps its slice (``distribute_tensor(..., src_data_rank=None)``: each rank slices its own
copy, no communication) and drops the rest before reading the next one. torchtitan builds
its models this way (meta init, parallelize, ``to_empty``, then load); torch's
``set_model_state_dict(..., broadcast_from_rank0=True)`` is the other way (rank 0 reads and
scatters), which holds the whole state dict on rank 0.

Sources:

* :class:`SafetensorsSource` -- a Hugging Face folder: each tensor read on its own from its
  ``.safetensors`` file (``safe_open``; the files are memory-mapped, never loaded whole). A
  folder stored in another layout than the model's (a mixture-of-experts model's per-expert
  files, which transformers fuses on load) is converted tensor by tensor as transformers'
  conversion mapping says (rpeg.runtime.model_io.checkpoint_names: stack the experts, join
  gate and up); a mapping with other operations is read once whole by ``from_pretrained``.
* :class:`ModuleSource` -- an in-memory model: the built-in random-init model (its values
  come from one seeded pass over the whole model, as ``create_tiny`` draws them, so that the
  sharded and the unsharded constructions start from the same weights) and the supervised
  warm-up's output. Dropped as soon as every role of the rank is filled.

What is not in a source (a value head beside the LM) is initialised as its module defines it
(:func:`init_head`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

#: fetch(name) -> the full tensor of ``name`` (on the host), or None when the source lacks it
Fetch = Callable[[str], torch.Tensor | None]


class WeightSource(Protocol):
    """Full tensors by state-dict name, one at a time."""

    def fetch(self, name: str) -> torch.Tensor | None: ...


class ModuleSource:
    """The state of an in-memory (unsharded) model, by name; :meth:`close` drops it. With
    :attr:`consume` set (one role reads it), each tensor is dropped as it is fetched, so the
    whole model shrinks while the rank's shard grows."""

    def __init__(self, model: nn.Module):
        self._state: dict[str, torch.Tensor] | None = dict(model.state_dict())
        self.consume = False

    def fetch(self, name: str) -> torch.Tensor | None:
        if self._state is None:
            raise RuntimeError("ModuleSource used after close()")
        t = self._state.pop(name, None) if self.consume else self._state.get(name)
        return None if t is None else t.detach()

    def fetch_rows(self, name: str, start: int, stop: int) -> torch.Tensor | None:
        """Rows ``start:stop`` of ``name`` (a rank's experts); with :attr:`consume` the rest
        is dropped."""
        if self._state is None:
            raise RuntimeError("ModuleSource used after close()")
        t = self._state.pop(name, None) if self.consume else self._state.get(name)
        return None if t is None else t.detach()[start:stop]

    def close(self) -> None:
        self._state = None


class SafetensorsSource:
    """The tensors of a Hugging Face folder's ``*.safetensors`` files (the index file's map
    when present), each read on its own when fetched."""

    def __init__(self, folder: str | Path):
        from safetensors import safe_open

        folder = Path(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{str(folder)!r} has no .safetensors weights")
        self._where: dict[str, Path] = {}
        index = folder / "model.safetensors.index.json"
        if index.exists():
            wm = json.loads(index.read_text()).get("weight_map", {})
            self._where = {k: folder / v for k, v in wm.items()}
        else:
            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    for k in fh.keys():  # noqa: SIM118 -- safe_open has no __iter__
                        self._where[k] = f
        self._open: dict[Path, object] = {}
        self._folder = folder
        self._converted: dict[str, torch.Tensor] | None = None
        self._convert: Fetch | bool | None = None  # None: not looked up yet; False: none

    def names(self) -> list[str]:
        return list(self._where)

    def _converted_state(self) -> dict[str, torch.Tensor]:
        """The folder's weights as the model names them, for a folder stored in another
        layout that transformers converts on load (a mixture-of-experts model's per-expert
        files: rpeg.runtime.model_io.loading.stored_as_converted): read whole, once, by
        ``from_pretrained`` on the host; {} for a folder stored as the model names it."""
        if self._converted is None:
            from transformers import AutoConfig, AutoModelForCausalLM

            from rpeg.runtime.model_io.loading import stored_as_converted

            self._converted = {}
            if not (self._folder / "config.json").exists():
                return self._converted
            cfg = AutoConfig.from_pretrained(self._folder, trust_remote_code=False)
            if stored_as_converted(str(self._folder), cfg):
                lm = AutoModelForCausalLM.from_pretrained(
                    self._folder, dtype="auto", use_safetensors=True, trust_remote_code=False
                )
                self._converted = dict(lm.state_dict())
        return self._converted

    def fetch(self, name: str) -> torch.Tensor | None:
        if name in self._where:
            return self._raw(name)
        convert = self._converter()
        t = convert(name) if convert else None
        if t is None and not self._convert:
            t = self._converted_state().get(name)
        return None if t is None else t.detach()

    def fetch_rows(self, name: str, start: int, stop: int) -> torch.Tensor | None:
        """Rows ``start:stop`` of ``name`` read on their own (a rank's experts: a stored
        stacked tensor by ``get_slice``, a per-expert folder only those experts' entries);
        None where :meth:`fetch` would go through the host-wide ``from_pretrained``."""
        f = self._where.get(name)
        if f is not None:
            fh = self._open.get(f)
            if fh is None:
                from safetensors import safe_open

                fh = self._open[f] = safe_open(str(f), framework="pt")
            return fh.get_slice(name)[start:stop]  # type: ignore[attr-defined]
        convert = self._converter()
        if not convert:
            return None
        t = convert(name, (start, stop))  # type: ignore[call-arg]
        return None if t is None else t.detach()

    def _converter(self):
        """transformers' conversion mapping of the folder's model type, tensor by tensor
        (rpeg.runtime.model_io.checkpoint_names); False when there is none it runs."""
        if self._convert is None:
            from rpeg.runtime.model_io.checkpoint_names import converted_fetch

            cfg = self._folder / "config.json"
            mt = json.loads(cfg.read_text()).get("model_type") if cfg.exists() else None
            self._convert = converted_fetch(mt, self._raw) or False
        return self._convert

    def _raw(self, name: str) -> torch.Tensor | None:
        """The folder's own tensor ``name`` (None when it has none)."""
        from safetensors import safe_open

        f = self._where.get(name)
        if f is None:
            return None
        fh = self._open.get(f)
        if fh is None:
            fh = self._open[f] = safe_open(str(f), framework="pt")
        return fh.get_tensor(name)  # type: ignore[attr-defined]

    def close(self) -> None:
        self._open.clear()
        self._converted = None


def on_meta(model: nn.Module) -> bool:
    """True when ``model`` has parameters and they are all on the meta device."""
    params = list(model.parameters())
    return bool(params) and all(p.is_meta for p in params)


def meta_causal_lm(config, dtype: torch.dtype) -> nn.Module:
    """A causal LM of ``config`` on the meta device (no storage), in ``dtype``."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def init_head(module: nn.Module) -> None:
    """Initialise the parameters of a module no source holds, as its constructor does: a
    value head starts at zero (rpeg.runtime.model_io.ValueHead)."""
    from torch.distributed.tensor import DTensor

    from rpeg.runtime.model_io import ValueHead

    if not isinstance(module, ValueHead):
        raise TypeError(f"no initialiser for {type(module).__name__} on the meta device")
    with torch.no_grad():
        for p in module.parameters():
            (p._local_tensor if isinstance(p, DTensor) else p).zero_()


def _allocate(module: nn.Module, device: torch.device) -> None:
    """Storage on ``device`` for a laid-out meta ``module`` (each parameter at its shard's
    size); tied weights tied again (``to_empty`` gives plain tied tensors their own storage)
    and rotary buffers recomputed."""
    from rpeg.runtime.model_io.loading import rebuild_rotary

    module.to_empty(device=device)
    if hasattr(module, "tie_weights") and getattr(module.config, "tie_word_embeddings", False):
        module.tie_weights()
    rebuild_rotary(module, device)


def materialize(module: nn.Module, device: torch.device, fetch: Fetch, where: str = "") -> int:
    """Give a laid-out meta ``module`` storage on ``device`` (each parameter at its local
    shard's size) and fill it from ``fetch`` one full tensor at a time; tied weights are tied
    again and rotary buffers recomputed. Returns the bytes this rank now holds. A name
    ``fetch`` lacks is an error naming it (``where``: the role, for the message)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    _allocate(module, device)
    held = 0
    missing: list[str] = []
    seen: set[int] = set()
    with torch.no_grad():
        for name, cur in module.state_dict(keep_vars=True).items():
            local = cur._local_tensor if isinstance(cur, DTensor) else cur
            if id(local) in seen:  # a tied tensor: filled once
                continue
            seen.add(id(local))
            part = _expert_rows(name, cur, fetch)  # a rank's experts, read on their own
            if part is not None:
                local.copy_(part.to(device=local.device, dtype=cur.dtype))
                held += local.numel() * local.element_size()
                continue
            full = fetch(name)
            if full is None:
                missing.append(name)
                continue
            if tuple(full.shape) != tuple(cur.shape):
                raise ValueError(
                    f"{where or 'model'}: {name} has shape {tuple(full.shape)} in the source, "
                    f"{tuple(cur.shape)} in the model"
                )
            full = full.to(device=local.device, dtype=cur.dtype)
            if isinstance(cur, DTensor):
                part = distribute_tensor(full, cur.device_mesh, cur.placements, src_data_rank=None)
                local.copy_(part._local_tensor)
            else:
                local.copy_(full)
            held += local.numel() * local.element_size()
            del full
    if missing:
        raise KeyError(
            f"{where or 'model'}: the weights lack {missing[:5]} ({len(missing)} in all)"
        )
    return held


def _expert_rows(name: str, cur: torch.Tensor, fetch: Fetch) -> torch.Tensor | None:
    """This rank's rows of an expert tensor split over ep (a DTensor ``Shard(0)`` on a 1-D
    ``ep`` mesh: rpeg.runtime.expert_parallel), read by the source's ``fetch_rows`` when
    ``fetch`` is a source's own ``fetch``; None otherwise (the full tensor is read)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(cur, DTensor) or cur.device_mesh.mesh_dim_names != ("ep",):
        return None
    if tuple(cur.placements) != (Shard(0),):
        return None
    rows = getattr(getattr(fetch, "__self__", None), "fetch_rows", None)
    if rows is None:
        return None
    n = cur._local_tensor.shape[0]
    start = cur.device_mesh.get_local_rank() * n
    part = rows(name, start, start + n)
    if part is None or tuple(part.shape) != tuple(cur._local_tensor.shape):
        return None
    return part


def materialize_like(module: nn.Module, device: torch.device, twin: nn.Module) -> int:
    """Give a laid-out meta ``module`` storage on ``device`` and fill each local shard from
    ``twin``'s (a role laid out the same way: the reference takes the actor's initial
    shards, cast to its own dtype), with no full tensor anywhere. Returns the bytes held."""
    from torch.distributed.tensor import DTensor

    from rpeg.runtime.lora import base_name, is_adapter_key

    _allocate(module, device)
    # a LoRA twin: its wrapped layers' ``base_layer`` tensors under the base names
    theirs = {
        base_name(k): v for k, v in twin.state_dict(keep_vars=True).items() if not is_adapter_key(k)
    }
    held = 0
    seen: set[int] = set()
    with torch.no_grad():
        for name, cur in module.state_dict(keep_vars=True).items():
            src = theirs[name]
            if isinstance(cur, DTensor) != isinstance(src, DTensor) or (
                isinstance(cur, DTensor) and tuple(cur.placements) != tuple(src.placements)
            ):
                raise ValueError(f"{name}: laid out differently from the role it copies")
            local = cur._local_tensor if isinstance(cur, DTensor) else cur
            if id(local) in seen:
                continue
            seen.add(id(local))
            theirs_local = src._local_tensor if isinstance(src, DTensor) else src
            local.copy_(theirs_local.detach())
            held += local.numel() * local.element_size()
    return held


def prefixed(fetch: Fetch, prefix: str) -> Fetch:
    """``fetch`` for a module whose names lack ``prefix`` (a critic's trunk is the LM's
    ``model.`` part: its ``layers.0...`` is the source's ``model.layers.0...``)."""
    return lambda name: fetch(prefix + name)
