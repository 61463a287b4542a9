"""A rank's models: the roles of its actor group (actor, reference, critic) built by
:func:`rpeg.runtime.role_builder.build_roles` as the local trainer builds them, on this rank's
device, computing in the plan's dtype; the group's process group, and the roles laid out by
the group's layout once it exists (tensor parallelism, FSDP2 or replicas over dp; pp and cp
through :mod:`rpeg.runtime.parallel_layout`, ep inside :mod:`rpeg.runtime.sharding`).

A part of :class:`rpeg.runtime.actors.rank.RankActor` (``rank.models``); the other parts read
its public attributes (``actor``, ``reference``, ``critic``, ``layout``, ``device``,
``reduce``, ``residency``, ``offloader``, ...).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import torch

from rpeg.compile.rank_program import RankProgram
from rpeg.runtime.actors.store_tls import TlsFiles

if TYPE_CHECKING:
    from rpeg.runtime.mesh import Layout
    from rpeg.runtime.role_builder import Roles
    from rpeg.runtime.roles import PolicyWorker


def sharded_build(layout: Layout, engine: str) -> bool:
    """Whether a rank builds its roles on the meta device and fills only its shards
    (rpeg.runtime.materialize): a sharded layout (tp > 1 or FSDP over dp > 1), LoRA or not.
    A vLLM engine is then built from the laid-out actor's weights, bucket by bucket
    (PolicyWorker.pending_engine)."""
    return (layout.sharded or layout.pp > 1) and engine in ("torch", "vllm")


class RankModels:
    """The roles of one rank, their layout and the group's process group."""

    def __init__(
        self,
        program: RankProgram,
        rank: int,
        *,
        cpu_slot: tuple[int, int] | None = None,
        gpu_slot: int | None = None,
    ):
        from rpeg.runtime.actors.rendezvous import rank_device
        from rpeg.runtime.parallel import LOCAL

        group = program.group
        self.program = program
        self.inputs = program.inputs  # the config sections the roles and stages read
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.roles = list(group.roles)
        self.trainable = list(group.trainable)
        self.k = int(program.staleness)  # checked before every optimizer update
        self.tls = None if program.tls_files is None else TlsFiles(*program.tls_files)
        self.pg_ready = False
        self.store: Any = None  # rank 0: the rendezvous store it keeps open
        self.device = rank_device(group, rank, gpu_slot)
        self.cpu_cores: list[int] = []  # this worker's cores (rpeg.runtime.cpu_binding)
        if cpu_slot is not None and self.device.type == "cpu":
            from rpeg.runtime.cpu_binding import HOST_CORES, bind_process, core_block, should_bind

            binding = self.inputs.runtime.cpu_binding
            if should_bind(binding, cpu_slot[1], len(HOST_CORES)):
                self.cpu_cores = bind_process(core_block(HOST_CORES, *cpu_slot))
        self.reduce = LOCAL  # replaced by a process-group reduce when the group has > 1 rank
        self.full_bytes: dict[str, int] | None = None  # the unsharded roles' bytes
        self._build()

    # ---------------------------------------------------------------- construction
    def _build(self) -> None:
        """The group's roles (rpeg.runtime.role_builder, as the local trainer builds them),
        on this rank's device, computing in the plan's dtype; they are sharded by the
        group's layout in init_process_group, once the process group exists."""
        from rpeg.runtime.mesh import Layout
        from rpeg.runtime.model_io import torch_dtype
        from rpeg.runtime.role_builder import build_roles

        p = self.program
        self.layout = Layout.from_group(self.group)
        # generation's layout: the plan's gen_tp over the same ranks (replicas across dp)
        gen_tp = self.group.gen_tp
        self.gen_layout = (
            self.layout
            if gen_tp == self.layout.tp and self.layout.replica_ranks == gen_tp
            else Layout(
                dp=self.world_size // gen_tp,
                tp=gen_tp,
                device_type=self.layout.device_type,
                dtype=self.layout.dtype,
            )
        )
        trainable = "actor" in self.trainable
        engine = p.engine  # "torch" | "vllm": the group's, resolved by the driver
        built = build_roles(
            self.inputs,
            self.roles,
            engine=engine,
            actor_trainable=trainable,
            # vLLM holds its own weights; with torch and k>0 colocated: a lagging copy
            lagging_engine=trainable and self.k > 0 and not p.async_rollout,
            colocated=trainable,
            place=lambda m: m.to(device=self.device),  # built there: nothing to move
            device=self.device,
            # fp32 masters for trainable roles, compute in the plan's dtype (rpeg.runtime.precision)
            compute_dtype=torch_dtype(self.layout.dtype),
            engine_memory=self.group.gen_memory_utilization,  # the plan's generate unit
            engine_eager=self.group.gen_enforce_eager,  # its enforce_eager (vLLM)
            # a sharded layout: roles built on the meta device, each filled with its shard
            # once laid out (_apply_layout; rpeg.runtime.materialize)
            sharded_build=sharded_build(self.layout, engine),
        )
        self.source = built.source
        if self.device.type == "cpu" and self._large_blocks(built):
            from rpeg.runtime.unit_memory import return_large_allocations

            self.large_allocations_returned = return_large_allocations()
        self.rewards, self.heldout = built.rewards, built.heldout
        self.tokenizer, self.warmup_info = built.tokenizer, built.warmup_info
        self.actor, self.reference, self.critic = built.actor, built.reference, built.critic
        if self.source is not None and hasattr(self.source, "consume"):
            # the actor's LM is the source's one reader (the reference copies the actor's
            # shards): each full tensor is dropped once the actor holds its slice
            own_copy = self.actor is not None and (
                self.gen_layout is not self.layout
                or getattr(self.actor.engine, "model", None) is not self.actor.lm
            )
            self.source.consume = self.actor is not None and self.critic is None and not own_copy
        if self.actor is not None:
            self.actor.max_staleness = self.k  # checked before every optimizer update
        from rpeg.runtime.engines.residency import EngineResidency

        # colocated (this rank trains the actor): the engine sleeps while the trainer runs
        self.residency = EngineResidency(
            None if self.actor is None else self.actor.engine, colocated=trainable
        )
        from rpeg.runtime.unit_memory import Offloader, apply_recompute

        if self.group.recompute:  # the plan's training unit: every decoder layer checkpointed
            for name in self.trainable:
                wk = getattr(self, name, None)
                if wk is not None:
                    apply_recompute(wk.module)
        # units with offload: their roles' state in host memory between uses
        self.offloader = Offloader(self.role_map(), self.device)

    @staticmethod
    def _large_blocks(built: Roles) -> bool:
        """Whether the rank's model has blocks FSDP splits (rpeg.runtime.sharding.block_parts)."""
        from rpeg.runtime.model_io.architectures import decoder_layers
        from rpeg.runtime.sharding import FSDP_SPLIT_BYTES

        wk = built.actor or built.reference or built.critic
        lm = getattr(wk, "lm", None) or getattr(getattr(wk, "module", None), "trunk", None)
        try:
            blocks = decoder_layers(lm)
        except (TypeError, AttributeError):
            return False
        block = blocks[0] if blocks else None
        return (
            block is not None and sum(p.numel() * 4 for p in block.parameters()) > FSDP_SPLIT_BYTES
        )

    def policy(self) -> PolicyWorker:
        """The actor, for what needs one (weight sync, checksums): an error naming the rank
        where it holds none."""
        if self.actor is None:
            raise RuntimeError(f"group {self.group.name} rank {self.rank} holds no actor")
        return self.actor

    def param_bytes(self, full: bool) -> dict[str, int]:
        """Bytes of the parameters of each role this rank holds: on this rank, or unsharded
        (``full``); a generation engine with its own copy as ``engine``."""
        from rpeg.runtime.sharding import param_bytes_full, param_bytes_local

        fn = param_bytes_full if full else param_bytes_local
        out = {}
        for name, wk in self.role_map().items():
            if wk is not None:
                out[name] = fn(wk.module)
        actor = self.actor
        eng = actor.engine if actor is not None else None
        held = getattr(eng, "model", None)
        if actor is None or eng is None:
            return out
        if held is None:  # vLLM: its own full copy, in its own process
            out["engine"] = int(getattr(eng, "param_bytes", 0))
        elif held is not actor.lm:
            out["engine"] = fn(held)
        return out

    def role_map(self) -> dict[str, Any]:
        """``{"actor": ..., "reference": ..., "critic": ...}`` (None where not held)."""
        return {"actor": self.actor, "reference": self.reference, "critic": self.critic}

    def fault(self, phase: str, step: int) -> None:
        """A deterministic fault point (rpeg.runtime.actors.fault_points; off unless
        ``RPEG_FAULT_AT`` is set)."""
        if phase:
            from rpeg.runtime.actors.fault_points import fault_point

            fault_point(self.group.name, self.rank, phase, step)

    # ---------------------------------------------------------------- process group (remote)
    def ping(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "rank": self.rank,
            "group": self.group.name,
            "host": socket.gethostname(),
        }

    def rendezvous(self) -> str:
        """``host:port`` of a TCPStore this rank (0) keeps open: the Dask worker's own host,
        the port bound by the OS (no free-port race; rpeg.runtime.actors.rendezvous)."""
        from rpeg.runtime.actors.rendezvous import master_store

        self.store, addr = master_store(tls=self.tls)
        return addr

    def collective_timeout_s(self) -> float:
        """The process groups' timeout: the program's (the driver's, from the plan's
        prediction: rpeg.runtime.actors.predicted)."""
        return float(self.program.collective_timeout_s)

    def init_process_group(self, init_method: str, timeout_s: float | None = None) -> bool:
        """Join the group's process group (timeout: :meth:`collective_timeout_s`; on CUDA
        bound to this rank's GPU with ``device_id``) and shard the roles by the group's
        layout (:meth:`_apply_layout`)."""
        import datetime

        import torch.distributed as dist

        if self.world_size == 1:
            return True
        if dist.is_initialized():
            raise RuntimeError("this worker process already hosts a rank of another group")
        from rpeg.runtime.actors.rendezvous import join_store

        if timeout_s is None:
            timeout_s = self.collective_timeout_s()
        backend = self.group.backend
        store = self.store if self.rank == 0 else None
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            store=store or join_store(init_method, tls=self.tls),
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=self.device if cuda else None,
        )
        self._apply_layout()
        self.pg_ready = True
        return True

    def _apply_layout(self) -> None:
        """The ``("dp", "tp")`` mesh of the group; every role sharded by the layout
        (rpeg.runtime.sharding.shard_roles): tensor parallelism over tp, FSDP2 over dp when
        ``fsdp``, else dp replicas whose gradients are averaged before clipping. A frozen
        reference is sharded like the actor but holds no optimizer. Batch statistics reduce
        over the dp ranks (the tp ranks of one dp index hold the same rows)."""
        from rpeg.runtime.mesh import build_mesh
        from rpeg.runtime.parallel import LOCAL, process_group_reduce

        lay = self.layout
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.full_bytes = self.param_bytes(full=True)
        if lay.pp > 1 or lay.cp > 1:  # stages / sequence shards (rpeg.runtime.parallel_layout)
            from rpeg.runtime.parallel_layout import apply_stage_layout

            return apply_stage_layout(self)
        self.mesh = build_mesh(lay)
        self.reduce = process_group_reduce(self.mesh.get_group("dp")) if lay.dp > 1 else LOCAL
        gen_mesh = self.mesh if self.gen_layout is lay else build_mesh(self.gen_layout)
        fill = {"source": self.source, "device": self.device}
        if self.actor is not None:
            self.actor.apply_layout(lay, self.mesh, self.reduce, self.gen_layout, gen_mesh, **fill)
            if self.actor.engine is not self.residency.engine:  # built from the shards
                from rpeg.runtime.engines.residency import EngineResidency

                self.residency = EngineResidency(
                    self.actor.engine, colocated="actor" in self.trainable
                )
        if self.critic is not None:
            self.critic.apply_layout(lay, self.mesh, self.reduce, **fill)
        if self.reference is not None and lay.sharded:
            # the reference starts as the actor: its shards are copied, cast to its dtype
            like = None if self.actor is None or fill["source"] is None else self.actor.lm
            self.reference.apply_layout(lay, self.mesh, self.reduce, like=like, **fill)
        elif self.reference is not None:
            self.reference.reduce = self.reduce
        if self.source is not None:  # every role filled: the whole weights are dropped
            close = getattr(self.source, "close", None)
            if close is not None:
                close()
            self.source = None

    def tp_index(self, generates: bool = False) -> int:
        """This rank's index among the ranks holding its rows (0 before the layout exists):
        its tp index at the generation layout (``generates``), else ``rank % replica_ranks``
        (tp, cp and pp ranks of one dp index)."""
        lay = getattr(self, "gen_layout" if generates else "layout", None)
        return 0 if lay is None else self.rank % lay.replica_ranks

    # ---------------------------------------------------------------- versions, residency
    def policy_version(self) -> int:
        return -1 if self.actor is None else int(self.actor.policy_version)

    def engine_version(self) -> int:
        return -1 if self.actor is None else int(self.actor.engine.policy_version)

    def resident(self) -> None:
        """Every role offloaded by a unit back on this rank's device (before what reads
        them outside the units: checkpoints, weight sync, evaluation)."""
        off = getattr(self, "offloader", None)
        if off is not None:
            off.restore_all()

    def close_engine(self) -> None:
        """Shut a vLLM engine down (its processes and shared memory)."""
        from rpeg.runtime.engines.vllm import shutdown_engine

        actor = getattr(self, "actor", None)
        if actor is not None:
            shutdown_engine(actor.engine)

    def leave_group(self) -> None:
        """Leave the group's default process group."""
        import torch.distributed as dist

        from rpeg.runtime.pair_channel import close_pair_channels

        if self.pg_ready and dist.is_initialized():
            close_pair_channels()
            dist.destroy_process_group()
            self.pg_ready = False
