"""The compiled step as typed, frozen data: :class:`CompiledStep` (actor groups with their
layout, ordered execution units, weight sync, staleness buffer) and its YAML/JSON form.
Produced by :func:`rpeg.compile.compiler.compile_step`, executed by the runtime: the objects
travel to the actors as they are (picklable frozen dataclasses; no dicts, no positional
tuples). Pure.

The staleness bound k is stored once, :attr:`CompiledStep.staleness`; every default of a
field the runtime reads is written here once (``DEFAULT_DEVICE_TYPE``, ``DEFAULT_DTYPE``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal

import yaml

from rpeg.errors import ConfigError, Problem
from rpeg.ir import StageKind
from rpeg.plan.schema import DEFAULT_PP_SCHEDULE

SUPPORTED_ROLES = ("actor", "reference", "critic")
ROLLOUT_KINDS = frozenset({StageKind.generate, StageKind.reward})
TRAINABLE_KINDS = {StageKind.train_actor: "actor", StageKind.train_critic: "critic"}
# 4: Buffer without off_policy_correction; 5: without Buffer.rollout_units/train_units and
# CompiledStep.shared_actor_critic (nothing read them: the tasks' phases and shared_forward)
FORMAT_VERSION = 5
#: kinds that run a forward (and backward) pass over micro-batches of ``micro_batch_size``
FORWARD_KINDS = frozenset(
    {
        StageKind.old_logprob,
        StageKind.ref_logprob,
        StageKind.values,
        StageKind.train_actor,
        StageKind.train_critic,
    }
)
BACKENDS = {"cpu": ("gloo",), "cuda": ("nccl", "gloo")}
DTYPES = ("float32", "bfloat16", "float16")
#: the device type (and its dtype) of a rank when nothing says otherwise: the one place
DEFAULT_DEVICE_TYPE: Literal["cpu"] = "cpu"
DEFAULT_DTYPE: Literal["float32"] = "float32"
#: a bucketed weight sync's bucket size (bytes)
DEFAULT_BUCKET_BYTES = 4 << 20

Phase = Literal["rollout", "train"]
SyncMode = Literal["shared", "bucketed"]
DeviceType = Literal["cpu", "cuda"]
Backend = Literal["gloo", "nccl"]
Dtype = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class GroupSpec:
    """One actor group: one rank per device; its ranks form one process group.

    Layout (world_size = dp * pp * cp * tp; rank ``r``: tp index ``r % tp``, cp index
    ``(r // tp) % cp``, pipeline rank ``(r // (tp * cp)) % pp``, dp index
    ``r // (tp * cp * pp)``): training roles shard over dp with FSDP2 when ``fsdp``;
    tp > 1 splits every block by DTensor tensor parallelism; pp > 1 cuts the decoder layers
    into stages run by ``pp_schedule``; cp > 1 splits each sequence over ranks; ep > 1 places
    a MoE model's experts over ``ep`` ranks of a stage (carved out of ``dp * cp``). The
    ``tp * cp * pp`` ranks of one dp index hold the same rows (:attr:`replica_ranks`). ``gen_tp``: tensor-parallel size
    of the generation engine on these ranks (its own copy when it differs from tp);
    ``gen_engine``: the plan's engine of the group's generate unit (``auto``, ``torch``,
    ``vllm``; None: the group generates nothing), ``gen_memory_utilization`` its KV-cache
    share of the device and ``gen_enforce_eager`` whether a vLLM engine decodes without CUDA
    graphs (the unit's ``enforce_eager``). ``reshard_after_forward``: FSDP training frees each block's gathered
    parameters after its forward (the plan's setting, ``auto`` resolved by the compiler).
    ``recompute``: training checkpoints every decoder layer (the training unit's
    ``recompute``, ``auto`` resolved by the compiler: rpeg.perf.units.recomputes).
    """

    name: str
    devices: tuple[int, ...]
    world_size: int
    roles: tuple[str, ...]
    trainable: tuple[str, ...]
    units: tuple[str, ...]
    dp: int
    tp: int = 1
    fsdp: bool = False
    pp: int = 1
    cp: int = 1
    ep: int = 1
    pp_schedule: str = DEFAULT_PP_SCHEDULE
    gen_tp: int = 1
    gen_engine: str | None = None
    gen_memory_utilization: float | None = None
    gen_enforce_eager: bool = False
    reshard_after_forward: bool = True
    recompute: bool = False
    device_type: DeviceType = DEFAULT_DEVICE_TYPE
    dtype: Dtype = DEFAULT_DTYPE
    backend: Backend = "gloo"

    @property
    def replica_ranks(self) -> int:
        """Ranks of one data-parallel index (``tp * cp * pp``): they hold the same rows."""
        return self.tp * self.cp * self.pp

    def to_dict(self) -> dict[str, object]:
        d = _plain(self)
        d["devices"] = list(self.devices)
        d["roles"], d["trainable"], d["units"] = (
            list(self.roles),
            list(self.trainable),
            list(self.units),
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupSpec:
        d = _known(cls, d, "actor_groups")
        for k in ("devices", "roles", "trainable", "units"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)


@dataclass(frozen=True)
class TaskSpec:
    """One execution unit (a stage or a fused group) of the step on its actor group.

    ``depends_on``: data edges; ``after``: colocated units ordered before it with no data
    edge; ``concurrent_with``: units on other devices it may overlap. ``micro_batch_size``
    and ``max_tokens_per_micro_batch`` (a token budget; None: by count) apply to its forward
    passes, packed end to end without padding when ``seq_packing`` (the plan's
    ``UnitPlan.packs``; its budget then counts real tokens, docs/packing.md);
    ``stream_chunk_prompts`` > 0: a streaming rollout hands on that many prompt
    groups at a time. ``shared_forward``: actor-critic sharing, logits and values from one
    forward (read by the runtime's ``old_logprob`` stage: rpeg.runtime.stages.run_stage, through
    the stage loop's ``StageContext.unit``). ``offload``: the state of the roles the unit computes with goes to host memory
    once it has run, and comes back before a unit uses it (rpeg.runtime.unit_memory)."""

    name: str
    stages: tuple[str, ...]
    kinds: tuple[StageKind, ...]
    group: str
    phase: Phase
    micro_batch_size: int
    fused: bool = False
    streaming: bool = False
    shared_forward: bool = False
    depends_on: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    concurrent_with: tuple[str, ...] = ()
    max_tokens_per_micro_batch: int | None = None
    seq_packing: bool = False
    stream_chunk_prompts: int = 0
    offload: bool = False

    @property
    def generates(self) -> bool:
        return StageKind.generate in self.kinds

    @property
    def stream_chunk(self) -> int:
        """Prompt groups per streamed chunk when the unit streams, else 0."""
        return self.stream_chunk_prompts if self.streaming else 0

    def to_dict(self) -> dict[str, object]:
        d = _plain(self)
        d["kinds"] = [str(k) for k in self.kinds]
        d["stages"], d["depends_on"] = list(self.stages), list(self.depends_on)
        d["after"], d["concurrent_with"] = list(self.after), list(self.concurrent_with)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSpec:
        d = _known(cls, d, "tasks")
        try:
            d["kinds"] = tuple(StageKind(k) for k in d.get("kinds", ()))
        except ValueError as e:
            allowed = ", ".join(k.value for k in StageKind)
            raise ConfigError([Problem("tasks.kinds", f"{e}; allowed: {allowed}")]) from e
        for k in ("stages", "depends_on", "after", "concurrent_with"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)


@dataclass(frozen=True)
class WeightSync:
    """``shared``: the generators are the trainer's own processes (no copy). ``bucketed``:
    the trainer group ``source`` broadcasts the full weights in ``bucket_bytes`` buckets to
    every rank of the ``targets`` groups, every ``every_steps`` updates."""

    mode: SyncMode
    source: str
    targets: tuple[str, ...] = ()
    every_steps: int = 1
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    @property
    def copies(self) -> bool:
        """True when weights move between groups (a bucketed sync with targets)."""
        return self.mode == "bucketed" and bool(self.targets)

    def to_dict(self) -> dict[str, object]:
        return {**_plain(self), "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WeightSync:
        d = _known(cls, d, "weight_sync")
        d["targets"] = tuple(d.get("targets", ()))
        return cls(**d)


@dataclass(frozen=True)
class Buffer:
    """The staleness buffer between the step's rollout units and its train units
    (:meth:`CompiledStep.tasks_in`): a step trains on ``samples_per_step`` samples. Its bound
    is the step's :attr:`CompiledStep.staleness`; how off-policy rows are corrected is the
    trainer's (``algorithm.rollout_correction``, read whole by ``PolicyWorker.train_step``: its
    mode, bounds and scope are one decision, not a copy of its mode here)."""

    samples_per_step: int

    def to_dict(self) -> dict[str, object]:
        return _plain(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Buffer:
        return cls(**_known(cls, d, "buffer"))


@dataclass(frozen=True)
class CompiledStep:
    """The program of one RL step (docs/compile.md). ``staleness``: the bound k of every lag
    test of the runtime (stored here only)."""

    pipeline: str
    graph: str
    staleness: int
    num_devices: int
    actor_groups: tuple[GroupSpec, ...]
    tasks: tuple[TaskSpec, ...]
    weight_sync: WeightSync
    buffer: Buffer
    notes: tuple[str, ...] = ()
    format: int = FORMAT_VERSION

    # ---------------------------------------------------------------- access
    def task(self, name: str) -> TaskSpec:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def group(self, name: str) -> GroupSpec:
        for g in self.actor_groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def tasks_in(self, phase: str) -> list[TaskSpec]:
        return [t for t in self.tasks if t.phase == phase]

    @property
    def rollout_group(self) -> str:
        return next(t.group for t in self.tasks if t.generates)

    @property
    def trainer_group(self) -> str:
        return next(t.group for t in self.tasks if StageKind.train_actor in t.kinds)

    @property
    def async_rollout(self) -> bool:
        """True when generation runs on a group of its own (not the trainer's)."""
        return self.rollout_group != self.trainer_group

    def wait_list(self, name: str) -> list[str]:
        """Units ``name`` waits for inside one step: its data dependencies, the colocated units
        ordered before it, and every earlier unit of its phase on other devices that it is not
        ``concurrent_with`` (so removing a pair from ``concurrent_with`` serialises it)."""
        t = self.task(name)
        out = list(dict.fromkeys(t.depends_on + t.after))
        for u in self.tasks:
            if u.name == name:
                break
            if u.phase == t.phase and u.name not in out and u.name not in t.concurrent_with:
                out.append(u.name)
        return out

    # ---------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, object]:
        return {
            "format": self.format,
            "pipeline": self.pipeline,
            "graph": self.graph,
            "staleness": self.staleness,
            "num_devices": self.num_devices,
            "actor_groups": [g.to_dict() for g in self.actor_groups],
            "tasks": [t.to_dict() for t in self.tasks],
            "weight_sync": self.weight_sync.to_dict(),
            "buffer": self.buffer.to_dict(),
            "notes": list(self.notes),
        }

    def to_yaml(self) -> str:
        return str(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompiledStep:
        fmt = d.get("format", FORMAT_VERSION)
        if fmt != FORMAT_VERSION:
            raise ConfigError(
                [Problem("format", f"{fmt!r}: this RPEG reads format {FORMAT_VERSION}; recompile")]
            )
        return cls(
            pipeline=d["pipeline"],
            graph=d["graph"],
            staleness=int(d["staleness"]),
            num_devices=int(d["num_devices"]),
            actor_groups=tuple(GroupSpec.from_dict(g) for g in d["actor_groups"]),
            tasks=tuple(TaskSpec.from_dict(t) for t in d["tasks"]),
            weight_sync=WeightSync.from_dict(d["weight_sync"]),
            buffer=Buffer.from_dict(d["buffer"]),
            notes=tuple(d.get("notes", ())),
            format=fmt,
        )


def _plain(obj: object) -> dict[str, object]:
    """A frozen spec's fields as a dict (one level; the caller lists its tuples)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}  # type: ignore[arg-type]


def _known(cls: type, d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` when every key is a field of ``cls`` and every required field is there; else a
    ConfigError naming the unknown or missing one."""
    names = {f.name for f in fields(cls)}
    extra = sorted(set(d) - names)
    if extra:
        raise ConfigError(
            [Problem(f"{where}.{extra[0]}", f"unknown field; allowed: {', '.join(sorted(names))}")]
        )
    required = [f.name for f in fields(cls) if f.default is MISSING and f.name not in d]
    if required:
        raise ConfigError([Problem(f"{where}.{n}", "missing (required)") for n in required])
    return dict(d)
