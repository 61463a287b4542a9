"""A run's checkpoint: every trainable rank's state (or, for a sharded group, its ranks'
torch.distributed.checkpoint shards under ``<step folder>/<group>.dcp``), the driver's data
cursor, the rollouts in flight and the step scheduler's state, written through the run's
:class:`rpeg.runtime.actors.checkpoint.CheckpointStore` and restored from its newest
complete checkpoint. A part of :class:`rpeg.runtime.actors.driver.DistributedRun`."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

from rpeg.compile.step import CompiledStep, GroupSpec
from rpeg.config import RunConfig
from rpeg.runtime.actors.checkpoint import CheckpointError, CheckpointStore
from rpeg.runtime.actors.checkpoint import dumps as checkpoint_dumps
from rpeg.runtime.actors.checkpoint import loads as checkpoint_loads
from rpeg.runtime.actors.proxies import RankGroup
from rpeg.runtime.actors.run_data import Prompts, RunData
from rpeg.runtime.actors.shard_checkpoint import SHARDS_SUFFIX
from rpeg.runtime.samples import keep_samples_upto


def _writes_shards(g: GroupSpec) -> bool:
    """A trainable group sharded by FSDP (over dp, or dp x cp: rpeg.runtime.context_parallel)
    or TP: its ranks write their own shards of the weights and optimizer state at a
    checkpoint (no rank holds the whole of either)."""
    fsdp = g.fsdp and g.dp * max(1, g.cp) > 1
    return bool(g.trainable) and (g.tp > 1 or fsdp or g.ep > 1 or g.pp > 1)


class RunCheckpoints:
    """Checkpoint and restore of a distributed run: its ``store`` (None: no checkpoints), its
    groups (``group(name)``: the typed proxy), its data plane (the rollouts in flight) and its
    prompts (the data cursor, the prompts drawn ahead)."""

    def __init__(
        self,
        config: RunConfig,
        compiled: CompiledStep,
        store: CheckpointStore | None,
        group: Callable[[str], RankGroup],
        data: RunData,
        prompts: Prompts,
    ):
        self.config = config
        self.compiled = compiled
        self.store = store
        self.group = group
        self.data = data
        self.prompts = prompts

    def url(self, step_done: int) -> str | None:
        return None if self.store is None else self.store.step_url(step_done)

    def save(self, step_done: int, state: dict[str, Any]) -> dict[str, float]:
        """Save after ``step_done`` steps: trainable ranks; the data cursor, the rows of
        produced rollouts not trained yet, the prompts drawn for later steps, and ``state``
        (the step scheduler's: versions, lags, metrics)."""
        if self.store is None:
            return {}
        t0 = time.perf_counter()
        parts: dict[str, bytes] = {}
        sharded = sorted(g.name for g in self.compiled.actor_groups if _writes_shards(g))
        for g in self.compiled.actor_groups:
            if g.trainable:
                light = g.name in sharded  # its weights and optimizer: the ranks' shards
                for r, data in enumerate(self.group(g.name).state_bytes(light)):
                    parts[f"{g.name}-rank{r}.pt"] = data
        in_flight = self.data.payload_batches()  # rows of produced rollouts, from their actors
        driver = {
            "step": step_done,
            **self.prompts.state(step_done),  # the cursor, the prompts drawn for later steps
            "payloads": in_flight,
            "scheduler": state,
        }
        parts["driver.pt"] = checkpoint_dumps(driver)
        from rpeg.runtime.actors.checkpoint_identity import model_identity, run_identity

        meta = {
            "policy_version": step_done,
            **run_identity(self.config, self.compiled.actor_groups),
            "staleness": self.compiled.staleness,
            "model": model_identity(self.config.model),
        }

        def write_shards(url: str) -> dict[str, Any]:
            # every rank of a sharded group writes its own shards into the step's folder
            # (torch.distributed.checkpoint); nothing of them passes through this process
            for name in sharded:
                self.group(name).save_shards(f"{url}/{name}{SHARDS_SUFFIX}")
            return {"sharded_groups": sharded}

        info = self.store.save(
            step_done, parts, meta, before_commit=write_shards if sharded else None
        )
        if self.config.runtime.export_hf:  # from rank states or the sharded group's shards
            from rpeg.runtime.export import export_at_checkpoint

            export_at_checkpoint(self.config, info.path, step_done, print)
        return {
            "checkpoint_s": time.perf_counter() - t0,
            "checkpoint_bytes": float(info.meta["total_bytes"]),
        }

    def restore(self) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into the actors and the driver; return the
        step scheduler state saved with it (None without one)."""
        if self.store is None:
            return None
        got = self.store.latest()
        if got is None:
            return None
        failed: list[str] = []
        while True:  # a part that verifies but does not load (another model's weights under a
            # forged checksum, issue 44): named, and the previous checkpoint is loaded
            try:
                return self._restore_from(*got)
            except CheckpointError as exc:
                where = f"checkpoint {got[0].get('dir_url', got[0].get('step'))}"
                failed.append(f"{where}: {exc}")
                older = _older_verified(self.store, int(got[0].get("step") or 0))
                if older is None:
                    raise CheckpointError(
                        "; ".join(failed) + "; no earlier checkpoint of the run loads"
                    ) from None
                warnings.warn(
                    f"{where} does not load ({exc}); falling back to checkpoint step "
                    f"{older[0].get('step')}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                got = older

    def _restore_from(self, _meta: dict[str, Any], parts: dict[str, bytes]) -> dict[str, Any]:
        shards = set(_meta.get("sharded_groups", ()))
        for g in self.compiled.actor_groups:
            if g.trainable and g.name in shards:  # weights and optimizer from the shards
                self.group(g.name).load_shards(f"{_meta['dir_url']}/{g.name}{SHARDS_SUFFIX}")
            elif g.trainable and g.world_size > 1:
                # data-parallel replicas: rank 0 wrote the weights and optimizer state for
                # all of them (RankActor.state_bytes); each then takes its own RNG states
                first = self._rank_part(parts, g, 0)
                self.group(g.name).load_state_bytes([first] * g.world_size)
            if g.trainable:
                self.group(g.name).load_state_bytes(
                    [self._rank_part(parts, g, r) for r in range(g.world_size)]
                )
        d = checkpoint_loads(parts["driver.pt"])
        keep_samples_upto(self.config.runtime.output_dir, int(d["step"]))  # logged again
        self.prompts.load(d)
        self.data.load_payloads(d["payloads"])
        scheduler: dict[str, Any] = d["scheduler"]
        return scheduler

    def _rank_part(self, parts: dict[str, bytes], g: GroupSpec, r: int) -> bytes:
        """Rank ``r`` of group ``g``'s saved state; after a layout change
        (``--allow-change layout``, checked in the preflight: data-parallel replicas only)
        a rank the checkpoint lacks loads its group's rank 0 part -- the replicas are
        identical -- or, for a renamed group, the rank 0 part of the one trainable group
        the checkpoint holds."""
        name = f"{g.name}-rank{r}.pt"
        if name in parts or "layout" not in self.config.runtime.allow_change:
            if name not in parts:
                raise CheckpointError(f"no part {name} (parts {sorted(parts)})")
            return parts[name]
        if f"{g.name}-rank0.pt" in parts:
            return parts[f"{g.name}-rank0.pt"]
        firsts = sorted(p for p in parts if p.endswith("-rank0.pt"))
        if len(firsts) != 1:
            raise KeyError(f"{name}: the checkpoint holds {sorted(parts)}; cannot reshard")
        return parts[firsts[0]]


def _older_verified(
    store: CheckpointStore, step: int
) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The newest complete, verified checkpoint of ``store`` before ``step`` (None: none)."""
    for s in sorted((s for s in store.complete_steps() if s < step), reverse=True):
        try:
            return store.verify(s)
        except CheckpointError:
            continue
    return None
