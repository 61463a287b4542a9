"""The compiled step as plain data: :class:`CompiledStep` (actor groups with their layout,
ordered unit tasks, weight sync, staleness buffer) and its YAML/JSON form. Produced by
:func:`rpeg.compile.compiler.compile_step`, executed by the runtime. Pure."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

SUPPORTED_ROLES = ("actor", "reference", "critic")
ROLLOUT_KINDS = frozenset({"generate", "reward"})
TRAINABLE_KINDS = {"train_actor": "actor", "train_critic": "critic"}
FORMAT_VERSION = 2
#: kinds that run a forward (and backward) pass over micro-batches of ``micro_batch_size``
FORWARD_KINDS = frozenset({"old_logprob", "ref_logprob", "values", "train_actor", "train_critic"})
BACKENDS = {"cpu": ("gloo",), "cuda": ("nccl", "gloo")}
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class ActorGroupSpec:
    name: str
    devices: list[int]
    world_size: int
    roles: list[str]
    trainable: list[str]
    units: list[str]
    backend: str = "gloo"
    # How the group's ranks lay out its roles (world_size = dp * tp). Training roles shard
    # over dp with FSDP2 when ``fsdp``; tp > 1 splits every block by DTensor tensor
    # parallelism (column-wise q/k/v/gate/up, row-wise o/down). ``gen_tp``: tensor-parallel
    # size of the generation engine on these ranks (its own copy when it differs from tp).
    dp: int = 0  # 0: world_size // tp
    tp: int = 1
    fsdp: bool = False
    gen_tp: int = 1
    # the generate unit's gpu_memory_utilization (a vLLM engine's KV-cache budget share of
    # its device); None: the group generates nothing (or an old compiled step)
    gen_memory_utilization: float | None = None
    # FSDP training: free each block's gathered parameters after its forward (False: keep
    # them gathered until backward; the plan's reshard_after_forward, "auto" resolved here)
    reshard_after_forward: bool = True
    device_type: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"  # the plan's precision on the device (bf16 on GPU)

    def __post_init__(self) -> None:
        if not self.dp:
            self.dp = max(1, self.world_size // max(1, self.tp))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TaskSpec:
    name: str
    stages: list[str]
    kinds: list[str]
    group: str
    phase: str
    fused: bool = False
    streaming: bool = False
    shared_forward: bool = False  # actor-critic sharing: logits and values from one forward
    depends_on: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    concurrent_with: list[str] = field(default_factory=list)
    micro_batch_size: int = 1
    # streaming: finished samples flow on, ``stream_chunk_prompts`` prompt groups at a time
    stream_chunk_prompts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompiledStep:
    pipeline: str
    graph: str
    staleness: int
    shared_actor_critic: bool
    num_devices: int
    actor_groups: list[ActorGroupSpec]
    tasks: list[TaskSpec]
    weight_sync: dict[str, Any]
    buffer: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    format: int = FORMAT_VERSION

    # ---------------------------------------------------------------- access
    def task(self, name: str) -> TaskSpec:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def group(self, name: str) -> ActorGroupSpec:
        for g in self.actor_groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def tasks_in(self, phase: str) -> list[TaskSpec]:
        return [t for t in self.tasks if t.phase == phase]

    @property
    def rollout_group(self) -> str:
        return next(t.group for t in self.tasks if "generate" in t.kinds)

    @property
    def trainer_group(self) -> str:
        return next(t.group for t in self.tasks if "train_actor" in t.kinds)

    # ---------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "pipeline": self.pipeline,
            "graph": self.graph,
            "staleness": self.staleness,
            "shared_actor_critic": self.shared_actor_critic,
            "num_devices": self.num_devices,
            "actor_groups": [g.to_dict() for g in self.actor_groups],
            "tasks": [t.to_dict() for t in self.tasks],
            "weight_sync": dict(self.weight_sync),
            "buffer": dict(self.buffer),
            "notes": list(self.notes),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompiledStep:
        return cls(
            pipeline=d["pipeline"],
            graph=d["graph"],
            staleness=d["staleness"],
            shared_actor_critic=d["shared_actor_critic"],
            num_devices=d["num_devices"],
            actor_groups=[ActorGroupSpec(**g) for g in d["actor_groups"]],
            tasks=[TaskSpec(**t) for t in d["tasks"]],
            weight_sync=d["weight_sync"],
            buffer=d["buffer"],
            notes=list(d.get("notes", [])),
            format=d.get("format", FORMAT_VERSION),
        )

    # ---------------------------------------------------------------- runtime reads
    @property
    def max_staleness(self) -> int:
        """The bound k every lag test of the runtime uses (``buffer.max_staleness``)."""
        return int(self.buffer["max_staleness"])

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
