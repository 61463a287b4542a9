"""A rank's weight sync between groups: the trainer ranks gather the full weights into buckets
and its rank 0 broadcasts them over the weight-sync process group; generator ranks receive
and load them (rpeg.runtime.actors.weight_sync). A part of
:class:`rpeg.runtime.actors.rank.RankActor` (``rank.weights``) over its models
(:class:`rpeg.runtime.actors.rank_models.RankModels`)."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from rpeg.runtime.engines.base import refresh_engine

if TYPE_CHECKING:
    from rpeg.runtime.actors.rank_models import RankModels


class RankWeights:
    """A rank's side of the weight sync: the weight-sync process group it is a member of
    (trainer rank 0 and every generator rank) and what it sends or receives over it."""

    def __init__(self, models: RankModels) -> None:
        self.models = models
        self.sync_store: Any = None  # trainer rank 0: the weight-sync group's store
        self.sync_pg: Any = None  # the weight-sync process group (None: not a member)

    def close(self) -> None:
        """Shut the weight-sync group down (NCCL communicators are not freed by dropping
        the object)."""
        pg, self.sync_pg = self.sync_pg, None
        if pg is not None:
            with contextlib.suppress(Exception):  # a peer already gone: nothing left to free
                pg.shutdown()

    # ---------------------------------------------------------------- weight sync
    def get_weight_buckets(self, bucket_bytes: int) -> tuple[list[Any], int]:
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors.weight_sync import pack

        actor = m.policy()
        return pack(actor.get_weights(), bucket_bytes), int(actor.policy_version)

    # ---------------------------------------------------------------- weight sync by collective
    def sync_rendezvous(self) -> str:
        """Trainer rank 0: a TCPStore for the weight-sync group (source + every generator)."""
        from rpeg.runtime.actors.rendezvous import master_store

        self.sync_store, addr = master_store(tls=self.models.tls)
        return addr

    def join_sync_group(
        self, address: str, sync_rank: int, size: int, timeout_s: float | None = None
    ) -> bool:
        """Join the weight-sync process group (sync rank 0 = the trainer's rank 0; gloo on
        CPU, NCCL on CUDA). Trainer ranks other than 0 are not members: they only take part
        in gathering the full weights."""
        from rpeg.runtime.actors.rendezvous import join_store, standalone_group

        m = self.models
        if timeout_s is None:
            timeout_s = m.collective_timeout_s()
        store = self.sync_store if sync_rank == 0 else join_store(address, tls=m.tls)
        from rpeg.runtime.mesh import process_group_backend

        backend = process_group_backend(m.device.type)
        self.sync_pg = standalone_group(store, "weight-sync", sync_rank, size, backend, timeout_s)
        return True

    def send_weights(self, bucket_bytes: int) -> dict[str, float]:
        """Trainer ranks: gather the full weights one tensor at a time (a collective when
        sharded) into ``bucket_bytes`` buckets on this rank's device; rank 0 broadcasts each
        over the weight-sync group as it fills (GPU: no host copy; the others drop theirs)."""
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors.weight_sync import send_buckets, stream_buckets

        m.fault("sync", m.policy_version())
        t0 = time.perf_counter()
        actor = m.policy()
        v = int(actor.policy_version)
        meta, fetch = actor.weight_source()
        buckets = stream_buckets(meta, fetch, bucket_bytes, m.device)
        nbytes, n = send_buckets(self.sync_pg, buckets, v, m.device)
        if self.sync_pg is None:  # not a member (trainer rank > 0)
            return {"version": float(v)}
        return {
            "weight_sync_bytes": float(nbytes),
            "buckets": float(n),
            "weight_sync_send_s": time.perf_counter() - t0,
            "version": float(v),
        }

    def recv_weights(self, bucket_bytes: int) -> int:
        """Generator ranks: receive the broadcast buckets (layout from this rank's own full
        parameter shapes: same names, dtypes and order as the sender's) and load them; a
        tensor-parallel generator keeps its own slice (``set_weights`` reshards)."""
        m = self.models
        m.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        from rpeg.runtime.actors.weight_sync import receive_weights

        m.fault("sync", m.engine_version())
        actor = m.policy()
        meta = {k: (tuple(v.shape), v.dtype) for k, v in actor.lm.state_dict().items()}
        weights, v = receive_weights(self.sync_pg, meta, bucket_bytes, m.device)
        actor.set_weights(weights, policy_version=v)
        refresh_engine(actor.engine, actor.lm, weights, v)  # vLLM: loads them
        return v

    def weights_checksum(self) -> list[float]:
        """Per-tensor sums of the full actor weights, name order (sync tests)."""
        self.models.resident()  # offloaded roles back on the device (rpeg.runtime.unit_memory)
        full = self.models.policy().get_weights()
        return [float(full[k].double().sum()) for k in sorted(full)]
