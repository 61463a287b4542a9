"""Where a colocated generation engine's memory lives between rollouts (vLLM sleep mode).

In a colocated plan the generation engine shares its device with the trainer. After the
rollout the engine sleeps (vLLM ``sleep(level=1)``: weights offloaded to host memory, KV
cache discarded), so training has the device; at the weight sync it wakes the weights only,
receives the update, then wakes the KV cache, so the update never holds both a KV cache and
the trainer's tensors (the order verl's hybrid engine uses). One helper, called by both
runtimes (rpeg.runtime.local_trainer and rpeg.runtime.actors.rank):

- :meth:`EngineResidency.after_rollout` after the generate stage;
- :meth:`EngineResidency.before_update` / :meth:`EngineResidency.after_update` around the
  engine's ``update_weights`` at the weight sync.

A step without a sync (bounded staleness, k > 0) leaves the engine asleep until its next
``generate``, which wakes everything. It does nothing for an engine without sleep mode: the
torch engine, a separate generator group (not colocated), or a platform without sleep mode
(vLLM's CPU build; the engine was built without it, ``sleep_refused``), where a colocated plan
runs awake and this says so once. See docs/vllm.md "Sleep and wake".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The line a colocated plan prints once where the platform has no sleep mode.
NO_SLEEP_NOTICE = (
    "vLLM: this platform has no sleep mode (vLLM's CPU build): the colocated engine keeps "
    "its weights and KV cache while the trainer runs"
)


class EngineResidency:
    """Sleep/wake calls of one process's generation ``engine`` (see the module docstring).

    ``colocated``: the engine shares its device with training. Active only when colocated
    and the engine was built with sleep mode (``engine.sleep_mode``)."""

    def __init__(self, engine: Any, *, colocated: bool, log: Callable[[str], None] | None = None):
        self.engine = engine
        self.active = bool(colocated and getattr(engine, "sleep_mode", False))
        if colocated and getattr(engine, "sleep_refused", False):
            (log or print)(NO_SLEEP_NOTICE)

    def after_rollout(self) -> None:
        """The rollout is done: release the device (weights offloaded, KV cache discarded)."""
        if self.active:
            self.engine.sleep(level=1)

    def before_update(self) -> None:
        """A weight update follows: bring the weights back (not the KV cache yet), after the
        trainer's cached blocks went back to the device (:func:`release_cached_memory`)."""
        if self.active:
            release_cached_memory()
            self.engine.wake_up(tags=("weights",))

    def after_update(self) -> None:
        """The update is loaded: bring the KV cache back for the next rollout."""
        if self.active:
            release_cached_memory()
            self.engine.wake_up(tags=("kv_cache",))


def release_cached_memory() -> bool:
    """Hand the trainer's cached CUDA blocks back to the device before a sleeping engine
    wakes: PyTorch's caching allocator keeps freed blocks for reuse, and vLLM's wake
    allocates through its own allocator, which cannot use them (verl empties the cache at
    the same point). True when there was a CUDA context to release."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    torch.cuda.empty_cache()
    return True
