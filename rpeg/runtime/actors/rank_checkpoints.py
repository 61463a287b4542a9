"""What a rank writes to and loads from a checkpoint: its rank state (weights, optimizers, RNG
states, versions: rpeg.runtime.actors.checkpoint) or, for a sharded group, its
torch.distributed.checkpoint shards (rpeg.runtime.actors.shard_checkpoint). A part of
:class:`rpeg.runtime.actors.rank.RankActor` (``rank.checkpoints``) over its models
(:class:`rpeg.runtime.actors.rank_models.RankModels`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpeg.runtime.actors.rank_models import RankModels


class RankCheckpoints:
    """What a rank writes to and loads from a checkpoint (remote)."""

    def __init__(self, models: RankModels) -> None:
        self.models = models

    def state_bytes(self, light: bool = False) -> bytes:
        """Weights, optimizers, RNG states and policy/engine versions of this rank (``light``:
        RNG states and versions only, for a group whose ranks write their shards themselves:
        :meth:`save_shards`). A data-parallel replica other than the first (an unsharded
        layout, dp index > 0) holds rank 0's weights and optimizer state: it writes the light
        state, and a restore gives it rank 0's (RunCheckpoints._restore_from), so a
        checkpoint moves one copy of the model through the driver, not one per rank."""
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors.checkpoint import rank_state_bytes

        m.fault("checkpoint", m.policy_version())
        for role in m.role_map().values():  # a split pair's moments whole on both ranks
            consolidate = getattr(getattr(role, "shards", None), "consolidate", None)
            if consolidate is not None:  # (rpeg.runtime.pair_update; a collective)
                consolidate(role.optimizer)
        lay = getattr(m, "layout", None)
        replica = lay is not None and not lay.sharded and lay.dp_index(m.rank) > 0
        return rank_state_bytes(m.rank, m.group.name, m.role_map(), light or replica)

    def load_state_bytes(self, data: bytes) -> int:
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors.checkpoint import load_rank_state_bytes

        load_rank_state_bytes(data, m.role_map())
        return m.policy_version()

    def save_shards(self, url: str) -> str:
        """Write this rank's shards of the trainable roles (weights, optimizer state) and the
        rank-0 extras (generators, policy and engine versions) to ``url`` with
        torch.distributed.checkpoint, atomically; every rank of the group calls it with the
        same ``url`` (rpeg.runtime.actors.shard_checkpoint). Loadable at another layout by
        :meth:`load_shards`. The frozen reference is not written (rebuilt from its source)."""
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors import shard_checkpoint as SC

        m.fault("checkpoint", m.policy_version())
        extras = SC.worker_extras(actor=m.actor, critic=m.critic)
        if m.actor is not None:
            extras["engine_version"] = int(m.actor.engine.policy_version)
        return SC.save_shards(url, SC.worker_roles(actor=m.actor, critic=m.critic), extras)

    def load_shards(self, url: str) -> int:
        """Load :meth:`save_shards`' checkpoint (written at any layout) into this rank's
        shards; a lagging engine copy gets the loaded weights. Returns the policy version.
        Collective."""
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors import shard_checkpoint as SC

        template = SC.worker_extras(actor=m.actor, critic=m.critic)
        if m.actor is not None:
            template["engine_version"] = 0  # saved for the record
        extras = SC.load_shards(url, SC.worker_roles(actor=m.actor, critic=m.critic), template)
        SC.restore_extras(extras, actor=m.actor, critic=m.critic)
        if m.actor is not None:
            # a lagging engine copy restarts at the loaded weights (lag 0: within any bound k)
            eng = m.actor.engine
            if getattr(eng, "model", None) is not m.actor.lm:  # its own copy (or vLLM)
                from rpeg.runtime.actors.weight_sync import load_engine_from_actor

                load_engine_from_actor(eng, m.actor)
            eng.policy_version = m.actor.policy_version
        return m.policy_version()

    def param_checksum(self) -> float:
        """Sum of the actor's full weights (data-parallel ranks must agree). Sharded: a
        collective, every rank of the group calls it."""
        self.models.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.sharding import full_tensor_source

        # one gathered tensor at a time: a rank never holds the whole model for a checksum
        meta, fetch = full_tensor_source(self.models.policy().lm)
        return float(sum(float(fetch(k).double().sum()) for k in meta))
