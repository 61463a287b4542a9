"""The Dask actor of one rank (one device): it holds the model roles of its actor group
(actor, reference, critic) built by :func:`rpeg.runtime.role_builder.build_roles` as the
local trainer builds them, the optimizers of trainable roles, and a per-step store of
:class:`RolloutBatch` es so that a fused group (or colocated units) never moves data out of
the process between stages.

Ranks of one group form a torch.distributed process group (gloo on CPU, NCCL on GPU) and a
``("dp", "tp")`` device mesh; every role is sharded by the group's layout
(rpeg.runtime.sharding: tensor parallelism over tp, FSDP2 or averaged replicas over dp), so
gradients are averaged across the dp ranks before clipping and the optimizer step. Each dp
index trains on its shard of the step's prompts; the tp ranks of one index share it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

import torch

from rpeg.compile.step import GroupSpec
from rpeg.config import RunConfig
from rpeg.ir import StageKind
from rpeg.runtime.actors.memory import reset_peak_rss
from rpeg.runtime.actors.rank_checkpoints import RankCheckpoints
from rpeg.runtime.actors.rank_data import RankDataPlane
from rpeg.runtime.actors.rank_holdings import RankHoldings
from rpeg.runtime.actors.rank_weights import RankWeightSync
from rpeg.runtime.actors.row_shards import rollout_start
from rpeg.runtime.actors.unit_call import UnitCall
from rpeg.runtime.data import PromptShard
from rpeg.runtime.micro_batches import unit_micro_batches

# Data parallelism: batch-wide statistics (advantage whitening, the loss normalizer of a
# mini-batch) span every rank's shard. After joining the process group, the trainable workers
# get a ``rpeg.runtime.parallel.RankReduce`` that all-reduces over the group, and the advantage
# stage is given the same; GRPO/RLOO groups are never split (row_shards.shard_groups).


#: what the driver and the proxies call on a rank through Dask, by concern (everything else
#: is internal); the batch store and data plane, weight sync and checkpoints are mixins
REMOTE = {
    "lifecycle": ("ping", "rendezvous", "init_process_group", "close"),
    "units": ("run_unit", "run_units", "evaluate", "resident"),
    "data": ("put_batch", "get_batch", "drop", "rows", "pull", "commit", "received", "chunk"),
    "weight sync": (
        "get_weight_buckets",
        "sync_rendezvous",
        "join_sync_group",
        "send_weights",
        "recv_weights",
        "weights_checksum",
    ),
    "checkpoints": ("state_bytes", "load_state_bytes", "save_shards", "load_shards"),
    "inspection": (
        "layout_info",
        "memory_info",
        "policy_version",
        "engine_version",
        "param_checksum",
        "collective_timeout_s",
    ),
}


def sharded_build(layout, engine: str) -> bool:
    """Whether a rank builds its roles on the meta device and fills only its shards
    (rpeg.runtime.materialize): a sharded layout (tp > 1 or FSDP over dp > 1), LoRA or not.
    A vLLM engine is then built from the laid-out actor's weights, bucket by bucket
    (PolicyWorker.pending_engine)."""
    return (layout.sharded or layout.pp > 1) and engine in ("torch", "vllm")


class RankActor(RankDataPlane, RankWeightSync, RankCheckpoints, RankHoldings):
    """One rank of an actor group (its remote surface: :data:`REMOTE`); called through Dask.
    It holds the group's roles on this rank's device in the group's layout and runs the
    compiled units it is handed (:class:`UnitCall`)."""

    def __init__(
        self,
        config_yaml: str,
        group: GroupSpec,
        rank: int,
        async_rollout: bool = False,
        *,
        k: int,
        collective_timeout_s: float | None = None,
        cpu_slot: tuple[int, int] | None = None,
        gpu_slot: int | None = None,
    ):
        """``group``: the compiled group this rank belongs to; ``k``: the compiled step's
        staleness bound; ``collective_timeout_s``: the process groups' timeout (None: the
        config's rule, :meth:`collective_timeout_s`)."""
        if not isinstance(group, GroupSpec):
            raise TypeError(f"RankActor: group must be a GroupSpec, got {type(group).__name__}")
        self.config = RunConfig.from_yaml(config_yaml)  # torch threads: set by build_roles
        from rpeg.runtime.actors import serializers

        serializers.register()
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.roles = list(group.roles)
        self.trainable = list(group.trainable)
        self._timeout_s = collective_timeout_s
        self.store: dict[int, Any] = {}
        self.incoming: dict[int, Any] = {}  # pulled rows waiting for ``commit`` (self-reshard)
        self.pg_ready = False
        # the compiled step's staleness bound and this rank's device (data plane, lag tests)
        self.k = int(k)
        from rpeg.runtime.actors.rendezvous import rank_device

        self.device = rank_device(group, rank, gpu_slot)
        self.cpu_cores: list[int] = []  # this worker's cores (rpeg.runtime.cpu_binding)
        if cpu_slot is not None and self.device.type == "cpu":
            from rpeg.runtime.cpu_binding import HOST_CORES, bind_process, core_block, should_bind

            if should_bind(self.config.runtime.cpu_binding, cpu_slot[1], len(HOST_CORES)):
                self.cpu_cores = bind_process(core_block(HOST_CORES, *cpu_slot))
        self.received_bytes = 0  # tensor bytes pulled from other actors (data plane)
        self._chunks: dict[int, list[Any]] = {}  # streamed chunks of a step (producer side)
        self._chunks_done: set[int] = set()
        reset_peak_rss()
        self._forwards = 0
        self._hooked: set[int] = set()
        self._sync_pg = None
        from rpeg.runtime.parallel import LOCAL

        self.reduce = LOCAL  # replaced by a process-group reduce when the group has > 1 rank
        self._build(async_rollout)

    # ---------------------------------------------------------------- construction
    def _build(self, async_rollout: bool) -> None:
        """The group's roles (rpeg.runtime.role_builder, as the local trainer builds them),
        on this rank's device, computing in the plan's dtype; they are sharded by the
        group's layout in init_process_group, once the process group exists."""
        from rpeg.runtime.engines.choice import rank_engine
        from rpeg.runtime.mesh import Layout
        from rpeg.runtime.model_io import torch_dtype
        from rpeg.runtime.role_builder import build_roles

        c = self.config
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
        engine = rank_engine(c, self.group)  # "torch" | "vllm"
        built = build_roles(
            c,
            self.roles,
            engine_kind=lambda _model: engine,
            actor_trainable=trainable,
            # vLLM holds its own weights; with torch and k>0 colocated: a lagging copy
            lagging_engine=trainable and self.k > 0 and not async_rollout,
            colocated=trainable,
            place=lambda m: m.to(device=self.device),  # built there: nothing to move
            device=self.device,
            # fp32 masters for trainable roles, compute in the plan's dtype (rpeg.runtime.precision)
            compute_dtype=torch_dtype(self.layout.dtype),
            engine_memory=self.group.gen_memory_utilization,  # the plan's generate unit
            # a sharded layout: roles built on the meta device, each filled with its shard
            # once laid out (_apply_layout; rpeg.runtime.materialize)
            sharded_build=sharded_build(self.layout, engine),
        )
        self._source = built.source
        if self.device.type == "cpu" and self._large_blocks(built):
            from rpeg.runtime.unit_memory import return_large_allocations

            self.large_allocations_returned = return_large_allocations()
        self.rewards, self.heldout = built.rewards, built.heldout
        self.tokenizer, self.warmup_info = built.tokenizer, built.warmup_info
        self.actor, self.reference, self.critic = built.actor, built.reference, built.critic
        if self._source is not None and hasattr(self._source, "consume"):
            # the actor's LM is the source's one reader (the reference copies the actor's
            # shards): each full tensor is dropped once the actor holds its slice
            own_copy = self.actor is not None and (
                self.gen_layout is not self.layout
                or getattr(self.actor.engine, "model", None) is not self.actor.lm
            )
            self._source.consume = self.actor is not None and self.critic is None and not own_copy
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
        self.offloader = Offloader(
            {"actor": self.actor, "reference": self.reference, "critic": self.critic},
            self.device,
        )

    @staticmethod
    def _large_blocks(built) -> bool:
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

    def _fault(self, phase: str, step: int) -> None:
        """A deterministic fault point (rpeg.runtime.actors.fault_points; off unless
        ``RPEG_FAULT_AT`` is set)."""
        if phase:
            from rpeg.runtime.actors.fault_points import fault_point

            fault_point(self.group.name, self.rank, phase, step)

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
        from rpeg.runtime.actors.store_tls import tls_files

        self._store, addr = master_store(tls=tls_files(self.config.cluster))
        return addr

    def collective_timeout_s(self) -> float:
        """The process groups' timeout: the one this rank was started with (the lifecycle's,
        from the plan's prediction: rpeg.runtime.actors.predicted), else the config's rule."""
        if self._timeout_s is not None:
            return float(self._timeout_s)
        from rpeg.runtime.actors.predicted import collective_timeout_s

        return collective_timeout_s(self.config)

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
        from rpeg.runtime.actors.store_tls import tls_files

        if timeout_s is None:
            timeout_s = self.collective_timeout_s()
        backend = self.group.backend
        store = getattr(self, "_store", None) if self.rank == 0 else None
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            store=store or join_store(init_method, tls=tls_files(self.config.cluster)),
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
        self._full_bytes = self._param_bytes(full=True)
        if lay.pp > 1 or lay.cp > 1:  # stages / sequence shards (rpeg.runtime.parallel_layout)
            from rpeg.runtime.parallel_layout import apply_stage_layout

            return apply_stage_layout(self)
        self.mesh = build_mesh(lay)
        self.reduce = process_group_reduce(self.mesh.get_group("dp")) if lay.dp > 1 else LOCAL
        gen_mesh = self.mesh if self.gen_layout is lay else build_mesh(self.gen_layout)
        fill = {"source": self._source, "device": self.device}
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
        if self._source is not None:  # every role filled: the whole weights are dropped
            close = getattr(self._source, "close", None)
            if close is not None:
                close()
            self._source = None

    def _tp_index(self, generates: bool = False) -> int:
        """This rank's index among the ranks holding its rows (0 before the layout exists):
        its tp index at the generation layout (``generates``), else ``rank % replica_ranks``
        (tp, cp and pp ranks of one dp index)."""
        lay = getattr(self, "gen_layout" if generates else "layout", None)
        return 0 if lay is None else self.rank % lay.replica_ranks

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

    # ---------------------------------------------------------------- stages
    def run_unit(self, step: int, call: UnitCall) -> Any:
        """Run the stages of one execution unit (``call.unit``) back to back on this rank's
        batch of ``step``, its forward passes at the unit's micro-batch size and token budget.

        ``call.prompts``: this rank's prompts of the step, for a unit that generates. A
        streaming unit that starts with generation (``unit.stream_chunk`` > 0): one decode,
        the unit's later stages run on every ``stream_chunk`` prompts whose samples have
        finished, while the rest decode (:meth:`_run_streamed`). ``call.stream_from``: run on
        that generator rank's chunks as they come."""
        if not isinstance(call, UnitCall):
            raise TypeError(f"run_unit: expected a UnitCall, got {type(call).__name__}")
        unit, prompts, stream_from = call.unit, call.prompts, call.stream_from
        kinds = list(unit.kinds)
        self._fault("generate" if StageKind.generate in kinds else "", step)
        self._fault("train" if any(k.startswith("train_") for k in kinds) else "", step)
        t0 = time.perf_counter()
        self._hook_forwards()
        f0 = self._forwards
        roles = (self.actor, self.reference, self.critic)
        budget = unit.max_tokens_per_micro_batch
        self.offloader.before(kinds)
        with unit_micro_batches(roles, unit.micro_batch_size, budget):
            if stream_from is not None:
                m, spans = self._consume_stream(step, kinds, stream_from)
            elif unit.stream_chunk and kinds[0] == StageKind.generate and prompts:
                m, spans = self._run_streamed(step, kinds, prompts, unit.stream_chunk)
            else:
                examples = None if prompts is None else prompts.examples
                seed, first = rollout_start(self.config, step, prompts)
                m, spans = self._run_stages(step, kinds, examples, seed, first_row=first)
        from rpeg.runtime import samples as SM
        from rpeg.runtime.actors.dataplane import tensor_bytes
        from rpeg.runtime.actors.unit_result import Span, UnitResult, counted_tokens

        self.offloader.after(kinds, unit.offload)
        if unit.offload:  # moves so far (either way): the plan's offload at work
            m["offload_moves"] = float(self.offloader.moves)
        batch = self.store.get(step)
        m["unit_s"] = time.perf_counter() - t0
        m["forward_calls"] = float(self._forwards - f0)
        logged = (
            batch is not None
            and StageKind.advantage in kinds
            and SM.log_step(step, self.config.runtime.log_samples_every)
        )
        return UnitResult(
            metrics=m,
            spans=tuple(Span(*sp) for sp in spans),
            pid=os.getpid(),
            # counted once per dp index, on tp index 0 (unit_result.counted_tokens)
            num_tokens=counted_tokens(
                None if batch is None else batch.num_tokens,
                self._tp_index(StageKind.generate in kinds),
            ),
            rows=None if batch is None else int(batch.size),
            batch_bytes=0 if batch is None else int(tensor_bytes(batch)),
            samples=SM.samples_from_batch(batch, step, rules=self.rewards.names) if logged else (),
        )

    def run_units(self, step: int, calls: list[UnitCall]) -> list[Any]:
        """Several units of ``step`` back to back in one call (a chain of the driver's:
        rpeg.runtime.actors.unit_chains). Their results in order; the first failure ends
        the call."""
        return [self.run_unit(step, c) for c in calls]

    def _stage_context(self):
        from rpeg.runtime import stages as S

        return S.StageContext(
            self.config,
            actor=self.actor,
            reference=self.reference,
            critic=self.critic,
            rewards=self.rewards,
            reduce=self.reduce,
        )

    def _run_stages(self, step, kinds, examples, seed, batch_key=None, first_row=0):
        from rpeg.runtime import stages as S

        key = step if batch_key is None else batch_key
        m: dict[str, Any] = {}
        spans: list[tuple[str, float, float]] = []
        ctx = self._stage_context()
        for kind in kinds:
            ts = time.time()
            batch = self.store.get(key)
            if kind == StageKind.sync_weights:
                from rpeg.runtime.actors.weight_sync import refresh_lagging_engine

                m.update(refresh_lagging_engine(self.actor, self.residency, self.k))
            elif kind == StageKind.env and spans:  # ran inside generate's turns: env_s
                spans.append(S.env_span(spans[-1][2], m))
                continue
            else:
                batch, sm = S.run_stage(
                    kind, ctx, batch, examples=examples, seed=seed, first_row=first_row
                )
                m.update(sm)
                if kind == StageKind.generate:
                    self.residency.after_rollout()
            self.store[key] = batch
            spans.append((kind, ts, time.time()))
        return m, spans

    def _run_streamed(self, step, kinds, prompts: PromptShard, chunk):
        from rpeg.runtime.actors import streaming

        seed, first = rollout_start(self.config, step, prompts)
        out = streaming.produce(self, step, kinds, prompts.examples, chunk, seed, first)
        self.residency.after_rollout()
        return out

    def _consume_stream(self, step, kinds, producer):
        from rpeg.runtime.actors import streaming

        return streaming.consume(self, step, kinds, producer)

    def _hook_forwards(self) -> None:
        """Count forward calls of every role's module (the observable of micro_batch_size)."""
        for wk in (self.actor, self.reference, self.critic):
            mod = (getattr(wk, "lm", None) or getattr(wk, "module", None)) if wk else None
            mod = getattr(mod, "model", mod)  # the decoder: log-prob passes skip the LM head
            if mod is None or id(mod) in self._hooked:
                continue
            self._hooked.add(id(mod))
            mod.register_forward_pre_hook(
                lambda *_a: setattr(self, "_forwards", self._forwards + 1)
            )

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Validation metrics of this rank's actor (rpeg.runtime.validation)."""
        from rpeg.runtime.validation import validation_metrics

        self.resident()
        return validation_metrics(
            self.actor,
            self.tokenizer,
            self.heldout,
            self.rewards,
            self.config.task.prompt_template,
        )

    def close(self) -> None:
        """Leave the group's default process group and shut the weight-sync group down
        (NCCL communicators are not freed by dropping the object)."""
        import torch.distributed as dist

        from rpeg.runtime.engines.vllm import shutdown_engine
        from rpeg.runtime.pair_channel import close_pair_channels

        if self.actor is not None:  # a vLLM engine's processes and shared memory
            shutdown_engine(self.actor.engine)
        pg, self._sync_pg = self._sync_pg, None
        if pg is not None:
            with contextlib.suppress(Exception):  # a peer already gone: nothing left to free
                pg.shutdown()
        if self.pg_ready and dist.is_initialized():
            close_pair_channels()
            dist.destroy_process_group()
            self.pg_ready = False
