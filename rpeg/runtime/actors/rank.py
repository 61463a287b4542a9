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
from rpeg.runtime.actors.memory import peak_rss, reset_peak_rss
from rpeg.runtime.actors.row_shards import rollout_start
from rpeg.runtime.actors.unit_call import UnitCall
from rpeg.runtime.data import PromptShard
from rpeg.runtime.engines.base import refresh_engine
from rpeg.runtime.micro_batches import unit_micro_batches

# Data parallelism: batch-wide statistics (advantage whitening, the loss normalizer of a
# mini-batch) span every rank's shard. After joining the process group, the trainable workers
# get a ``rpeg.runtime.parallel.RankReduce`` that all-reduces over the group, and the advantage
# stage is given the same; GRPO/RLOO groups are never split (row_shards.shard_groups).


def process_group_backend(device: torch.device) -> str:
    """The process-group backend for a model on ``device`` (rpeg.runtime.sharding's rule)."""
    from rpeg.runtime.sharding import process_group_backend as backend_for

    return backend_for(device.type)


class RankActor:
    """One rank of an actor group. Methods are the stage kinds; called through Dask."""

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
        from rpeg.runtime.model_io import torch_dtype
        from rpeg.runtime.role_builder import build_roles
        from rpeg.runtime.sharding import Layout

        c = self.config
        self.layout = Layout.from_group(self.group)
        # generation's layout: the plan's gen_tp over the same ranks (replicas across dp)
        gen_tp = self.group.gen_tp
        self.gen_layout = (
            self.layout
            if gen_tp == self.layout.tp
            else Layout(
                dp=self.world_size // gen_tp,
                tp=gen_tp,
                device_type=self.layout.device_type,
                dtype=self.layout.dtype,
            )
        )
        trainable = "actor" in self.trainable
        built = build_roles(
            c,
            self.roles,
            engine_kind=lambda _model: rank_engine(c, self.group),  # "torch" | "vllm"
            actor_trainable=trainable,
            # vLLM holds its own weights; with torch and k>0 colocated: a lagging copy
            lagging_engine=trainable and self.k > 0 and not async_rollout,
            colocated=trainable,
            place=lambda m: m.to(device=self.device),  # built there: nothing to move
            device=self.device,
            # fp32 masters for trainable roles, compute in the plan's dtype (rpeg.runtime.precision)
            compute_dtype=torch_dtype(self.layout.dtype),
            engine_memory=self.group.gen_memory_utilization,  # the plan's generate unit
        )
        self.rewards, self.heldout = built.rewards, built.heldout
        self.tokenizer, self.warmup_info = built.tokenizer, built.warmup_info
        self.actor, self.reference, self.critic = built.actor, built.reference, built.critic
        if self.actor is not None:
            self.actor.max_staleness = self.k  # checked before every optimizer update
        from rpeg.runtime.engines.residency import EngineResidency

        # colocated (this rank trains the actor): the engine sleeps while the trainer runs
        self.residency = EngineResidency(
            None if self.actor is None else self.actor.engine, colocated=trainable
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

        self._store, addr = master_store()
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

        if timeout_s is None:
            timeout_s = self.collective_timeout_s()
        backend = self.group.backend
        store = getattr(self, "_store", None) if self.rank == 0 else None
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            store=store or join_store(init_method),
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
        from rpeg.runtime.parallel import LOCAL, process_group_reduce
        from rpeg.runtime.sharding import build_mesh

        lay = self.layout
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._full_bytes = self._param_bytes(full=True)
        self.mesh = build_mesh(lay)
        self.reduce = process_group_reduce(self.mesh.get_group("dp")) if lay.dp > 1 else LOCAL
        gen_mesh = self.mesh if self.gen_layout is lay else build_mesh(self.gen_layout)
        if self.actor is not None:
            self.actor.apply_layout(lay, self.mesh, self.reduce, self.gen_layout, gen_mesh)
        if self.critic is not None:
            self.critic.apply_layout(lay, self.mesh, self.reduce)
        if self.reference is not None and lay.sharded:
            self.reference.apply_layout(lay, self.mesh, self.reduce)
        elif self.reference is not None:
            self.reference.reduce = self.reduce

    def _param_bytes(self, full: bool) -> dict[str, int]:
        from rpeg.runtime.sharding import param_bytes_full, param_bytes_local

        fn = param_bytes_full if full else param_bytes_local
        out = {}
        for name in ("actor", "reference", "critic"):
            wk = getattr(self, name)
            if wk is not None:
                out[name] = fn(wk.module)
        eng = self.actor.engine if self.actor is not None else None
        held = getattr(eng, "model", None)
        if eng is not None and held is None:  # vLLM: its own full copy, in its own process
            out["engine"] = int(getattr(eng, "param_bytes", 0))
        elif eng is not None and held is not self.actor.lm:
            out["engine"] = fn(held)
        return out

    def layout_info(self) -> dict[str, Any]:
        """This rank's layout and what it holds: ``param_bytes_per_rank`` (bytes of the
        parameters this rank holds, per role) and ``full_param_bytes`` (of the unsharded
        roles), with their totals."""
        lay = self.layout
        local = self._param_bytes(full=False)
        full = getattr(self, "_full_bytes", None) or self._param_bytes(full=True)
        return {
            "group": self.group.name,
            "rank": self.rank,
            "dp": lay.dp,
            "tp": lay.tp,
            "fsdp": lay.fsdp,
            "dp_index": lay.dp_index(self.rank),
            "tp_index": lay.tp_index(self.rank),
            "device": str(self.device),
            "cpu_cores": list(self.cpu_cores),
            "dtype": lay.dtype,
            "param_bytes_per_rank": {**local, "total": sum(local.values())},
            "full_param_bytes": {**full, "total": sum(full.values())},
        }

    def _model_device(self) -> torch.device:
        for role in (self.actor, self.critic, self.reference):
            prm = next(role.module.parameters(), None) if role is not None else None
            if prm is not None:
                return prm.device
        return torch.device("cpu")

    # ---------------------------------------------------------------- data
    def put_batch(self, step: int, batch: Any) -> int:
        self.store[step] = batch
        return batch.size

    def get_batch(self, step: int, pop: bool = False) -> Any:
        return self.store.pop(step) if pop else self.store[step]

    def drop(self, step: int) -> None:
        self.store.pop(step, None)
        self._chunks.pop(step, None)
        self._chunks_done.discard(step)

    def policy_version(self) -> int:
        return -1 if self.actor is None else int(self.actor.policy_version)

    def engine_version(self) -> int:
        return -1 if self.actor is None else int(self.actor.engine.policy_version)

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
        from rpeg.runtime.actors.unit_result import Span, UnitResult

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
            num_tokens=None if batch is None else float(batch.num_tokens),
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

    async def chunk(self, step: int, i: int, timeout_s: float = 600.0) -> Any:
        """Chunk ``i`` of a streaming unit's rows of ``step`` as soon as it exists (None after
        the last one). Async: answered while this rank's actor thread still generates."""
        import asyncio

        deadline = time.monotonic() + timeout_s
        while True:
            got = self._chunks.get(step, [])
            if i < len(got):
                return got[i]
            if step in self._chunks_done:
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"chunk {i} of step {step} not produced in {timeout_s} s")
            await asyncio.sleep(0.002)

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

    # ---------------------------------------------------------------- data plane
    async def rows(self, step: int, start: int, end: int, fields: list[str] | None = None) -> Any:
        """Rows ``[start, end)`` of this rank's batch of ``step`` (trimmed to their lengths);
        only ``fields`` (a dict of tensors) when given. Async: served on the worker's event
        loop, also while this rank's actor thread computes."""
        b = self.store[step]
        sel = b.select(list(range(start, end))) if (start, end) != (0, b.size) else b
        if fields is None:
            return sel
        return {f: getattr(sel, f) for f in fields if getattr(sel, f) is not None}

    async def pull(
        self,
        step: int,
        sources: list[tuple[Any, int, int]],
        fields: list[str] | None = None,
        stage: bool = False,
    ) -> int:
        """Fetch rows from the producing actors (``(actor, start, end)`` each) directly, not
        through the driver. ``fields`` None: the rows become this rank's batch of ``step``;
        else those fields join it. ``stage``: keep them aside until :meth:`commit` (a group
        resharding its own batch). Returns the tensor bytes received."""
        import asyncio

        from rpeg.runtime.actors.dataplane import concat_rows, merge_fields, tensor_bytes

        got = await asyncio.gather(*[a.rows(step, s, e, fields) for a, s, e in sources])
        nbytes = sum(tensor_bytes(g) for g in got)
        self.received_bytes += nbytes
        if fields is None:
            new = concat_rows(got) if got else None
        else:
            new = merge_fields(self.store[step], got)
        if stage:
            self.incoming[step] = new
        else:
            self.store[step] = new
        return nbytes

    def commit(self, step: int) -> int:
        self.store[step] = self.incoming.pop(step)
        return self.store[step].size

    def received(self) -> int:
        return int(self.received_bytes)

    def memory_info(self) -> dict[str, Any]:
        """Peak memory of this rank since the actor started: the process's peak resident set
        (``VmHWM``, reset when the actor is created: a worker process outlives its actors),
        and the CUDA allocator's peak on a GPU rank."""
        out: dict[str, Any] = {"device": str(self.device), "peak_rss_bytes": peak_rss()}
        if self.device.type == "cuda":
            out["peak_device_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out

    # ---------------------------------------------------------------- weight sync
    def get_weight_buckets(self, bucket_bytes: int) -> tuple[list[Any], int]:
        from rpeg.runtime.actors.weight_sync import pack

        return pack(self.actor.get_weights(), bucket_bytes), int(self.actor.policy_version)

    # ---------------------------------------------------------------- weight sync by collective
    def sync_rendezvous(self) -> str:
        """Trainer rank 0: a TCPStore for the weight-sync group (source + every generator)."""
        from rpeg.runtime.actors.rendezvous import master_store

        self._sync_store, addr = master_store()
        return addr

    def join_sync_group(
        self, address: str, sync_rank: int, size: int, timeout_s: float | None = None
    ) -> bool:
        """Join the weight-sync process group (sync rank 0 = the trainer's rank 0; gloo on
        CPU, NCCL on CUDA). Trainer ranks other than 0 are not members: they only take part
        in gathering the full weights."""
        from rpeg.runtime.actors.rendezvous import join_store, standalone_group

        if timeout_s is None:
            timeout_s = self.collective_timeout_s()
        store = self._sync_store if sync_rank == 0 else join_store(address)
        backend = process_group_backend(self.device)
        self._sync_pg = standalone_group(store, "weight-sync", sync_rank, size, backend, timeout_s)
        return True

    def send_weights(self, bucket_bytes: int) -> dict[str, float]:
        """Trainer ranks: gather the full weights one tensor at a time (a collective when
        sharded) into ``bucket_bytes`` buckets on this rank's device; rank 0 broadcasts each
        over the weight-sync group as it fills (GPU: no host copy; the others drop theirs)."""
        from rpeg.runtime.actors.weight_sync import send_buckets, stream_buckets

        self._fault("sync", self.policy_version())
        t0 = time.perf_counter()
        v = int(self.actor.policy_version)
        meta, fetch = self.actor.weight_source()
        buckets = stream_buckets(meta, fetch, bucket_bytes, self.device)
        nbytes, n = send_buckets(self._sync_pg, buckets, v, self.device)
        if self._sync_pg is None:  # not a member (trainer rank > 0)
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
        from rpeg.runtime.actors.weight_sync import receive_weights

        self._fault("sync", self.engine_version())
        meta = {k: (tuple(v.shape), v.dtype) for k, v in self.actor.lm.state_dict().items()}
        weights, v = receive_weights(self._sync_pg, meta, bucket_bytes, self.device)
        self.actor.set_weights(weights, policy_version=v)
        refresh_engine(self.actor.engine, self.actor.lm, weights, v)  # vLLM: loads them
        return v

    def weights_checksum(self) -> list[float]:
        """Per-tensor sums of the full actor weights, name order (sync tests)."""
        full = self.actor.get_weights()
        return [float(full[k].double().sum()) for k in sorted(full)]

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> float:
        from rpeg.runtime.role_builder import greedy_accuracy

        return greedy_accuracy(
            self.actor,
            self.tokenizer,
            self.heldout,
            self.rewards,
            self.config.task.prompt_template,
        )

    # ---------------------------------------------------------------- checkpoints
    def state_bytes(self, light: bool = False) -> bytes:
        """Weights, optimizers, RNG states and policy/engine versions of this rank (``light``:
        RNG states and versions only, for a group whose ranks write their shards themselves:
        :meth:`save_shards`)."""
        from rpeg.runtime.actors.checkpoint import rank_state_bytes

        self._fault("checkpoint", self.policy_version())
        return rank_state_bytes(self.rank, self.group.name, self._roles(), light)

    def load_state_bytes(self, data: bytes) -> int:
        from rpeg.runtime.actors.checkpoint import load_rank_state_bytes

        load_rank_state_bytes(data, self._roles())
        return self.policy_version()

    def _roles(self) -> dict[str, Any]:
        return {"actor": self.actor, "reference": self.reference, "critic": self.critic}

    def save_shards(self, url: str) -> str:
        """Write this rank's shards of the trainable roles (weights, optimizer state) and the
        rank-0 extras (generators, policy and engine versions) to ``url`` with
        torch.distributed.checkpoint, atomically; every rank of the group calls it with the
        same ``url`` (rpeg.runtime.actors.shard_checkpoint). Loadable at another layout by
        :meth:`load_shards`. The frozen reference is not written (rebuilt from its source)."""
        from rpeg.runtime.actors import shard_checkpoint as SC

        self._fault("checkpoint", self.policy_version())
        extras = SC.worker_extras(actor=self.actor, critic=self.critic)
        if self.actor is not None:
            extras["engine_version"] = int(self.actor.engine.policy_version)
        return SC.save_shards(url, SC.worker_roles(actor=self.actor, critic=self.critic), extras)

    def load_shards(self, url: str) -> int:
        """Load :meth:`save_shards`' checkpoint (written at any layout) into this rank's
        shards; a lagging engine copy gets the loaded weights. Returns the policy version.
        Collective."""
        from rpeg.runtime.actors import shard_checkpoint as SC

        template = SC.worker_extras(actor=self.actor, critic=self.critic)
        if self.actor is not None:
            template["engine_version"] = 0  # saved for the record
        extras = SC.load_shards(
            url, SC.worker_roles(actor=self.actor, critic=self.critic), template
        )
        SC.restore_extras(extras, actor=self.actor, critic=self.critic)
        if self.actor is not None:
            # a lagging engine copy restarts at the loaded weights (lag 0: within any bound k)
            eng = self.actor.engine
            if getattr(eng, "model", None) is not self.actor.lm:  # vLLM has no .model
                eng.update_weights(self.actor.get_weights(), self.actor.policy_version)
            eng.policy_version = self.actor.policy_version
        return self.policy_version()

    def param_checksum(self) -> float:
        """Sum of the actor's full weights (data-parallel ranks must agree). Sharded: a
        collective, every rank of the group calls it."""
        from rpeg.runtime.sharding import full_state_dict

        return float(sum(float(v.double().sum()) for v in full_state_dict(self.actor.lm).values()))

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
