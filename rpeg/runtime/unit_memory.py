"""What a plan unit says about memory, executed: activation recompute and offload.

* ``recompute`` (a training unit; the compiled group's :attr:`GroupSpec.recompute`):
  :func:`apply_recompute` checkpoints every decoder layer of a trained model -- the layer's
  input is kept, its activations are recomputed in backward (transformers' per-layer
  gradient checkpointing over ``torch.utils.checkpoint``, non-reentrant, which composes with
  FSDP2 and DTensor tensor parallelism). A training micro-batch then keeps one layer's
  activations plus each layer's input instead of every layer's activations, for one more
  forward pass: what the performance model prices (rpeg.perf.passes.pass_cost, 4 passes).
* ``offload`` (any unit; :attr:`TaskSpec.offload`): :class:`Offloader` moves the state of
  the roles a unit computes with -- parameters, gradients, optimizer state -- to host
  memory once the unit has run, and back onto the device before a unit uses them again, so
  that colocated units of other models (a generator's KV cache, the reference) have the
  device to themselves (verl's ``param_offload`` / ``optimizer_offload`` between stages).
  FSDP2 modules move with ``module.to`` (FSDP2 re-registers its sharded parameters). On a
  CPU device the host is the device: the moves are no-ops that still run (the tests
  exercise them), and the performance model prices no offload there
  (rpeg.perf.pricing). A vLLM engine has its own residency (sleep and wake:
  rpeg.runtime.engines.residency).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from rpeg.ir import StageKind

#: the roles each stage kind computes with
ROLES_OF_KIND: dict[str, tuple[str, ...]] = {
    StageKind.generate: ("actor",),
    StageKind.ref_logprob: ("reference",),
    StageKind.old_logprob: ("actor",),
    StageKind.values: ("critic", "actor"),
    StageKind.train_actor: ("actor",),
    StageKind.train_critic: ("critic", "actor"),
    StageKind.sync_weights: ("actor",),
}


def decoder_stack(module: nn.Module) -> nn.Module | None:
    """The transformers model whose decoder layers checkpoint (the LM, a critic's trunk, an
    actor-critic's LM), or None."""
    for m in (getattr(module, "lm", None), getattr(module, "trunk", None), module):
        if m is not None and hasattr(m, "gradient_checkpointing_enable"):
            return m
    return None


def apply_recompute(module: nn.Module) -> bool:
    """Checkpoint every decoder layer of ``module`` in training passes (module doc). False
    when it has no transformers decoder stack to checkpoint."""
    stack = decoder_stack(module)
    if stack is None:
        return False
    kwargs = {"use_reentrant": False}
    if hasattr(stack, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        stack.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        stack.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return True


def recomputes(module: nn.Module) -> bool:
    """Whether ``module``'s decoder layers are checkpointed."""
    stack = decoder_stack(module)
    if stack is None:
        return False
    if hasattr(type(stack), "is_activation_checkpointing"):  # transformers >= 5.x's name
        return bool(stack.is_activation_checkpointing)
    return bool(getattr(stack, "is_gradient_checkpointing", False))


def _move_optimizer(optimizer: Any, device: torch.device) -> None:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.device != device and v.dim() > 0:
                state[k] = v.to(device)


def move_role(worker: Any, device: torch.device) -> None:
    """The role's parameters and their gradients (``module.to``: FSDP2- and DTensor-aware),
    and its optimizer state, onto ``device``; a torch engine's own copy too."""
    worker.module.to(device)
    _move_optimizer(getattr(worker, "optimizer", None), device)
    eng_model = getattr(getattr(worker, "engine", None), "model", None)
    if isinstance(eng_model, nn.Module) and eng_model is not getattr(worker, "lm", None):
        eng_model.to(device)


class Offloader:
    """Which roles of a process sit in host memory, moved as units say (module doc)."""

    def __init__(
        self,
        roles: Mapping[str, Any],
        device: torch.device,
        host: torch.device | None = None,
    ):
        self.roles = {k: v for k, v in roles.items() if v is not None}
        self.device = torch.device(device)
        self.host = torch.device("cpu") if host is None else torch.device(host)
        self.on_host: set[str] = set()
        self.moves = 0  # role moves made (either way)

    def _used(self, kinds: Iterable[str]) -> list[str]:
        out: list[str] = []
        for k in kinds:
            for r in ROLES_OF_KIND.get(k, ()):
                if r in self.roles and r not in out:
                    out.append(r)
        return out

    def before(self, kinds: Iterable[str]) -> None:
        """Bring back the roles the unit of ``kinds`` computes with."""
        for r in self._used(kinds):
            if r in self.on_host:
                self._move(r, self.device)
                self.on_host.discard(r)
                self.moves += 1

    def _move(self, role: str, device: torch.device) -> None:
        """``move_role`` where the host is not the device itself (a CPU rank's host: walking
        the modules for a move that moves nothing took ~1.2 ms a unit, 12 ms of a 0.5 s
        built-in step)."""
        if self.host != self.device:
            move_role(self.roles[role], device)

    def after(self, kinds: Iterable[str], offload: bool) -> None:
        """Once the unit of ``kinds`` has run: with ``offload``, its roles go to the host,
        and a CUDA device's cached blocks are released for the next unit."""
        if not offload:
            return
        for r in self._used(kinds):
            if r not in self.on_host:
                self._move(r, self.host)
                self.on_host.add(r)
                self.moves += 1
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def restore_all(self) -> None:
        """Every role back on the device (before a checkpoint, an evaluation, the end)."""
        for r in sorted(self.on_host):
            self._move(r, self.device)
            self.moves += 1
        self.on_host.clear()


#: glibc ``mallopt`` parameters (malloc.h) and what a rank of a large model sets them to
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
LARGE_MMAP_THRESHOLD = 4 * 2**20
LARGE_TRIM_THRESHOLD = 64 * 2**20


def return_large_allocations() -> bool:
    """Make this process's allocator hand tensors of 4 MiB and more back to the OS when they
    are freed (glibc ``mallopt``: a fixed mmap threshold, a 64 MiB trim threshold).

    glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), after which
    FSDP's per-unit buffers, gradients and activations of a large model come from the heap
    and stay in the process when freed: at the 302M model's fsdp dp=2 with per-matrix FSDP
    units a rank's peak was 4.22 GB this way and 3.64 GB with these settings (one process,
    docs/measurements.md). The cost is a fresh mapping per large tensor (a 12 MB op ran
    1.5x slower), so ranks set it only for models whose blocks FSDP splits
    (rpeg.runtime.sharding.FSDP_SPLIT_BYTES). False where glibc is not the allocator."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, LARGE_MMAP_THRESHOLD) == 1
        return ok and libc.mallopt(_M_TRIM_THRESHOLD, LARGE_TRIM_THRESHOLD) == 1
    except (OSError, AttributeError):
        return False
