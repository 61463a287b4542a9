"""The Dask actor of one rank (one device): a thin holder of named parts.

* ``models``: :class:`rpeg.runtime.actors.rank_models.RankModels` -- the roles of its actor
  group (actor, reference, critic) built by :func:`rpeg.runtime.role_builder.build_roles` as
  the local trainer builds them, the group's process group and the roles laid out by the
  group's layout (tp, FSDP2 or replicas over dp; pp/cp: rpeg.runtime.parallel_layout);
* ``batches``: :class:`rpeg.runtime.actors.rank_data.RankBatches` -- a per-step store of
  :class:`RolloutBatch` es (a fused group, or colocated units, never moves data out of the
  process between stages) and the data plane (rows served to and pulled from other actors);
* ``units``: :class:`rpeg.runtime.actors.rank_units.RankUnits` -- the compiled units it is
  handed, stage by stage, and validation;
* ``weights``: :class:`rpeg.runtime.actors.rank_weights.RankWeights` -- the weight sync;
* ``checkpoints``: :class:`rpeg.runtime.actors.rank_checkpoints.RankCheckpoints`;
* ``holdings``: :class:`rpeg.runtime.actors.rank_holdings.RankHoldings` -- what it holds.

A rank receives no config: the driver hands it a :class:`rpeg.compile.rank_program.RankProgram`
(its group, the staleness bound, the group's resolved engine, the collective timeout, the
config sections its roles read), built once per run (rpeg.runtime.actors.programs).

Its remote surface (what the driver and the proxies call through Dask, :data:`REMOTE`) is
routed to the parts: ``rank.run_unit`` is ``rank.units.run_unit``.
"""

from __future__ import annotations

from typing import Any

from rpeg.compile.rank_program import RankProgram
from rpeg.runtime.actors.memory import reset_peak_rss
from rpeg.runtime.actors.rank_checkpoints import RankCheckpoints
from rpeg.runtime.actors.rank_data import RankBatches
from rpeg.runtime.actors.rank_holdings import RankHoldings
from rpeg.runtime.actors.rank_models import RankModels
from rpeg.runtime.actors.rank_units import RankUnits
from rpeg.runtime.actors.rank_weights import RankWeights
from rpeg.runtime.compute_thread import on_rank_thread

# Data parallelism: batch-wide statistics (advantage whitening, the loss normalizer of a
# mini-batch) span every rank's shard. After joining the process group, the trainable workers
# get a ``rpeg.runtime.parallel.RankReduce`` that all-reduces over the group, and the advantage
# stage is given the same; GRPO/RLOO groups are never split (row_shards.shard_groups).

__all__ = ["REMOTE", "RankActor"]


class _Route:
    """A remote name of the rank served by the method of the same name of one of its parts.
    On the class (what a Dask actor handle looks up) it is the part's function; on a rank,
    the part's bound method (what the worker calls)."""

    def __init__(self, part: str, function: Any):
        self.part = part
        self.function = function
        self.name = function.__name__

    def __get__(self, rank: Any, owner: type | None = None) -> Any:
        if rank is None:
            return self.function
        return getattr(getattr(rank, self.part), self.name)


class RankActor:
    """One rank of an actor group, called through Dask (its remote surface: :data:`REMOTE`).
    It holds the group's roles on this rank's device in the group's layout and runs the
    compiled units it is handed (:class:`rpeg.runtime.actors.unit_call.UnitCall`)."""

    def __init__(
        self,
        program: RankProgram,
        rank: int,
        *,
        cpu_slot: tuple[int, int] | None = None,
        gpu_slot: int | None = None,
    ):
        """``program``: what the driver resolved for this rank's group (no config text);
        ``rank``: its index in the group; ``cpu_slot`` / ``gpu_slot``: its worker's cores and
        GPU (rpeg.runtime.cpu_binding, rpeg.runtime.actors.rendezvous.gpu_slots)."""
        if not isinstance(program, RankProgram):
            raise TypeError(
                f"RankActor: program must be a RankProgram, got {type(program).__name__} "
                "(a rank receives no config)"
            )
        from rpeg.runtime.actors import serializers

        serializers.register()
        reset_peak_rss()
        self.program = program
        # built on the worker's actor thread, which runs the rank's methods: its torch threads
        # (runtime.torch_threads) and their OpenMP team are that thread's
        # (rpeg.runtime.compute_thread)
        self.models = on_rank_thread(
            lambda: RankModels(program, rank, cpu_slot=cpu_slot, gpu_slot=gpu_slot)
        )
        self.batches = RankBatches()
        self.units = RankUnits(self.models, self.batches)
        self.weights = RankWeights(self.models)
        self.checkpoints = RankCheckpoints(self.models)
        self.holdings = RankHoldings(self.models)

    def close(self) -> None:
        """Shut a vLLM engine and the weight-sync group down and leave the group's default
        process group (NCCL communicators are not freed by dropping the object)."""
        self.models.close_engine()
        self.weights.close()
        self.models.leave_group()

    # ---------------------------------------------------------------- remote, by part
    ping = _Route("models", RankModels.ping)
    rendezvous = _Route("models", RankModels.rendezvous)
    init_process_group = _Route("models", RankModels.init_process_group)
    collective_timeout_s = _Route("models", RankModels.collective_timeout_s)
    policy_version = _Route("models", RankModels.policy_version)
    engine_version = _Route("models", RankModels.engine_version)
    resident = _Route("models", RankModels.resident)

    run_unit = _Route("units", RankUnits.run_unit)
    run_units = _Route("units", RankUnits.run_units)
    evaluate = _Route("units", RankUnits.evaluate)

    put_batch = _Route("batches", RankBatches.put_batch)
    get_batch = _Route("batches", RankBatches.get_batch)
    drop = _Route("batches", RankBatches.drop)
    rows = _Route("batches", RankBatches.rows)
    pull = _Route("batches", RankBatches.pull)
    commit = _Route("batches", RankBatches.commit)
    received = _Route("batches", RankBatches.received)
    chunk = _Route("batches", RankBatches.chunk)

    get_weight_buckets = _Route("weights", RankWeights.get_weight_buckets)
    sync_rendezvous = _Route("weights", RankWeights.sync_rendezvous)
    join_sync_group = _Route("weights", RankWeights.join_sync_group)
    send_weights = _Route("weights", RankWeights.send_weights)
    recv_weights = _Route("weights", RankWeights.recv_weights)
    weights_checksum = _Route("weights", RankWeights.weights_checksum)

    state_bytes = _Route("checkpoints", RankCheckpoints.state_bytes)
    load_state_bytes = _Route("checkpoints", RankCheckpoints.load_state_bytes)
    save_shards = _Route("checkpoints", RankCheckpoints.save_shards)
    load_shards = _Route("checkpoints", RankCheckpoints.load_shards)
    param_checksum = _Route("checkpoints", RankCheckpoints.param_checksum)

    layout_info = _Route("holdings", RankHoldings.layout_info)
    memory_info = _Route("holdings", RankHoldings.memory_info)


#: what the driver and the proxies call on a rank through Dask, by the part that serves it
#: ("rank": the actor's own); everything else is internal
REMOTE: dict[str, tuple[str, ...]] = {"rank": ("close",)}
for _name, _value in vars(RankActor).items():
    if isinstance(_value, _Route):
        REMOTE[_value.part] = (*REMOTE.get(_value.part, ()), _name)
