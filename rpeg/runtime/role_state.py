"""What a model role's holder keeps apart from its model: its configs, the device its
weights live on, the RNG states of the GPUs, and its weights and optimizer as a checkpoint
holds them (full tensors; a sharded role gathers them, rpeg.runtime.sharding)."""

from __future__ import annotations

import copy
import random

import torch

from rpeg.config import AlgorithmConfig, OptimConfig, WorkloadConfig


def module_device(module) -> torch.device:
    from torch.distributed.tensor import DTensor

    p = next(module.parameters(), None)
    if p is None:
        return torch.device("cpu")
    return p._local_tensor.device if isinstance(p, DTensor) else p.device


def cuda_rng_states() -> list[torch.Tensor] | None:
    """Every visible GPU's RNG state (dropout, sampling on the device), None without CUDA."""
    return torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None


def restore_cuda_rng(states: list[torch.Tensor] | None) -> None:
    """Put back :func:`cuda_rng_states` on the GPUs this process sees (a checkpoint from a
    CPU run, or resumed on one, has nothing to restore)."""
    if not states or not torch.cuda.is_available():
        return
    for i, st in enumerate(states[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(st, device=i)


def role_configs(
    algorithm: AlgorithmConfig | None, optim: OptimConfig | None, workload: WorkloadConfig | None
) -> tuple[AlgorithmConfig, OptimConfig, WorkloadConfig]:
    """A role's configs, each config's defaults where none is given."""
    return algorithm or AlgorithmConfig(), optim or OptimConfig(), workload or WorkloadConfig()


def role_state(module, optimizer, shards) -> tuple[dict, dict | None]:
    """(weights, optimizer state) of a role; a LoRA policy's weights are its adapters (and a
    shared value head) only: the frozen base is rebuilt from its source (rpeg.runtime.lora)."""
    from rpeg.runtime.lora import adapter_state, adapter_state_names, has_lora

    lora = has_lora(module)
    if shards is not None and shards.layout.sharded:
        from rpeg.runtime.sharding import full_role_state

        weights, osd = full_role_state(module, optimizer)
        keep = adapter_state_names(module) if lora else weights
        return {k: v for k, v in weights.items() if k in keep}, osd
    if lora:
        weights = adapter_state(module)
    else:
        weights = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return weights, copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None


def load_role_state(module, optimizer, state: dict, shards) -> None:
    from rpeg.runtime.lora import has_lora, load_adapter_state

    sharded = shards is not None and shards.layout.sharded
    if has_lora(module):
        load_adapter_state(module, state["module"])
        if optimizer is not None and state.get("optimizer") is not None and sharded:
            import torch.distributed as dist
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_optimizer_state_dict,
            )

            opts = StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=dist.is_initialized()
            )
            set_optimizer_state_dict(module, optimizer, state["optimizer"], options=opts)
        elif optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        return
    if sharded:
        from rpeg.runtime.sharding import load_full_role_state

        load_full_role_state(module, optimizer, state["module"], state.get("optimizer"))
        return
    module.load_state_dict(state["module"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])


def policy_state(worker, weights: bool = True) -> dict:
    """A policy role's checkpoint (rpeg.runtime.roles.PolicyWorker): its weights (incl. a
    value head) and optimizer, RNG states, policy version and loss scaler. Sharded: the full
    weights and name-keyed optimizer state (a collective; any layout loads it). ``weights``
    False: RNG states and versions only (the shards are saved apart)."""
    out = {}
    if weights and not getattr(worker, "rebuilt_from_source", False):  # (a LoRA reference)
        out["module"], out["optimizer"] = role_state(worker.module, worker.optimizer, worker.shards)
    out |= {
        "generator": worker.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "policy_version": worker.policy_version,
    }
    cuda = cuda_rng_states()
    if cuda is not None:
        out["cuda_rng"] = cuda
    if worker.loss_scaler is not None:
        out["loss_scaler"] = worker.loss_scaler.state_dict()
    return out


def load_policy_state(worker, state: dict) -> None:
    """Put back :func:`policy_state` (without ``module``: the weights were loaded from the
    shards, RankActor.load_shards)."""
    if "module" in state and getattr(worker, "pipeline", None) is not None:
        from rpeg.runtime.pipeline import load_unsplit_state  # a whole model's, at pp > 1

        load_unsplit_state(worker, state["module"], state.get("optimizer"))
    elif "module" in state:
        load_role_state(worker.module, worker.optimizer, state, worker.shards)
    worker.generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    restore_cuda_rng(state.get("cuda_rng"))
    random.setstate(state["python_rng"])
    worker.policy_version = int(state["policy_version"])
    if worker.loss_scaler is not None and "loss_scaler" in state:
        worker.loss_scaler.load_state_dict(state["loss_scaler"])
