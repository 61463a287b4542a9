"""The execution plan: where and how every execution unit of a graph runs (pure).

A :class:`Plan` names, per execution unit (a stage or a fused group of the IR graph), the
devices it runs on (global indices on the cluster: rack/node/gpu follow from the cluster
topology), its parallel degrees, micro-batch size, activation recompute and offload. Units
whose device sets intersect time-share those devices (colocation). The plan also names the
graph (a builder and its options, or inline IR YAML), the cluster and its size, the staleness
bound k and whether in-flight rollouts survive a weight update (partial rollout).

One Plan drives both the performance model (``rpeg.perf.predict``) and the runtime.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rpeg import defaults
from rpeg.errors import ConfigError, Problem, RpegError

Engine = Literal["auto", "vllm", "sglang", "torch", "megatron", "fsdp"]
Reason = Literal["memory", "divisibility", "devices"]
#: the pipeline schedules the runtime runs (rpeg.runtime.pipeline) and the compiled step names
PpSchedule = Literal["1f1b", "interleaved_1f1b", "gpipe"]
PP_SCHEDULES: tuple[str, ...] = get_args(PpSchedule)
DEFAULT_PP_SCHEDULE: PpSchedule = "1f1b"
#: model chunks per pipeline rank of each schedule (interleaved 1F1B: Megatron's two virtual
#: stages per rank); the runtime cuts the model so and the performance model prices it so
PP_SCHEDULE_CHUNKS: dict[str, int] = {"1f1b": 1, "interleaved_1f1b": 2, "gpipe": 1}


def trains_fsdp(engine: str, *, cuda: bool, dp: int, pp: int = 1, cp: int = 1) -> bool:
    """Whether a training unit's ranks run FSDP2 (parameters, gradients and AdamW state
    sharded over its ``dp`` data-parallel ranks) rather than whole replicas. ``engine: fsdp``
    does; ``engine: auto`` does on CUDA devices when the unit has more than one
    data-parallel rank and no pipeline split (pipeline stages keep replicas; at context
    parallelism FSDP shards over the dp x cp ranks, as torchtitan composes them:
    rpeg.runtime.context_parallel.context_fsdp; ``cp`` does not change the rule): a replica
    holds the whole fp32 master and Adam moments, 16 bytes per parameter, which is what the
    GPU peers (verl's FSDP workers, torchtitan) avoid by default. CPU workers keep replicas
    under ``auto`` (gloo gathers per micro-batch cost more than they save at the sizes a CPU
    trains). One rule for the compiler (``GroupSpec.fsdp``), the performance model and the
    search."""
    if engine == "fsdp":
        return True
    return engine == "auto" and cuda and dp > 1 and pp == 1


class InfeasiblePlan(RpegError):
    """A plan that cannot run: ``reason`` is memory, divisibility or devices.

    ``needed_gb``/``capacity_gb`` are per device (memory); ``unit`` names the execution unit;
    ``device`` the first device that overflows. The optimizer counts candidates by ``reason``.
    """

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        unit: str = "",
        needed_gb: float | None = None,
        capacity_gb: float | None = None,
        device: int | None = None,
        breakdown: dict[str, float] | None = None,
    ):
        self.reason = reason
        self.unit = unit
        self.needed_gb = needed_gb
        self.capacity_gb = capacity_gb
        self.device = device
        self.breakdown = dict(breakdown or {})
        head = f"infeasible plan ({reason})"
        if unit:
            head += f" in {unit}"
        super().__init__(f"{head}: {message}")


# Largest device index a plan may name (a million GPUs: well beyond any cluster, small
# enough that a typo like "0-1e9" is refused instead of exhausting memory).
MAX_DEVICE_INDEX = 1 << 20


def parse_devices(spec: str | int | list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """``"0-15"``, ``"0-7,16-23"``, ``8`` (a single device) or a list -> sorted indices."""
    if isinstance(spec, bool):
        raise ValueError("devices must be a range string like '0-7' or a list of indices")
    if isinstance(spec, int):
        return (spec,)
    if isinstance(spec, (list, tuple)):
        out = tuple(int(x) for x in spec)
    else:
        out_l: list[int] = []
        for part in str(spec).replace(" ", "").split(","):
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError(f"range {part!r} is empty")
                if hi > MAX_DEVICE_INDEX:
                    raise ValueError(
                        f"range {part!r}: device indices must be <= {MAX_DEVICE_INDEX}"
                    )
                out_l.extend(range(lo, hi + 1))
            else:
                out_l.append(int(part))
        out = tuple(out_l)
    if not out:
        raise ValueError("no devices")
    if any(d < 0 for d in out):
        raise ValueError("device indices must be >= 0")
    if max(out) > MAX_DEVICE_INDEX:
        raise ValueError(f"device indices must be <= {MAX_DEVICE_INDEX}")
    if len(set(out)) != len(out):
        raise ValueError("duplicate device indices")
    return tuple(sorted(out))


@lru_cache(maxsize=4096)
def _num_devices_used(device_sets: tuple[tuple[int, ...], ...]) -> int:
    return len({d for ds in device_sets for d in ds})


@lru_cache(maxsize=4096)
def _colocated(units: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[frozenset[str], ...]:
    groups: list[tuple[set[int], set[str]]] = []
    for name, devs in units:
        ds = set(devs)
        merged_d, merged_n = ds, {name}
        rest = []
        for gd, gn in groups:
            if gd & ds:
                merged_d |= gd
                merged_n |= gn
            else:
                rest.append((gd, gn))
        groups = [*rest, (merged_d, merged_n)]
    return tuple(frozenset(n) for _, n in groups)


@lru_cache(maxsize=4096)
def format_devices(devs: tuple[int, ...]) -> str:
    """Inverse of :func:`parse_devices`: compact ``"0-7,16-23"``."""
    parts = []
    start = prev = devs[0]
    for d in devs[1:]:
        if d == prev + 1:
            prev = d
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        start = prev = d
    parts.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(parts)


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UnitPlan(_Base):
    """How one execution unit runs. ``dp`` 0 = derive (devices / (tp*pp*cp))."""

    devices: tuple[int, ...] = Field(description="global device indices ('0-15' in YAML)")
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    pp_schedule: PpSchedule = Field(
        DEFAULT_PP_SCHEDULE,
        description="pipeline schedule at pp > 1: 1f1b (PipeDream-flush), interleaved_1f1b "
        "(two model chunks per pipeline rank, half the bubble), gpipe (all forwards, then all "
        "backwards)",
    )
    dp: int = Field(0, ge=0, description="0 = devices // (tp*pp*cp)")
    ep: int = Field(1, ge=1, description="expert parallel (carved out of dp*cp*tp)")
    cp: int = Field(1, ge=1, description="context / Ulysses sequence parallel")
    micro_batch_size: int = Field(
        defaults.UNIT_MICRO_BATCH_SIZE,
        ge=1,
        description="samples (or packed sequences) per micro-batch",
    )
    recompute: bool | Literal["auto"] = Field(
        "auto",
        description="training: checkpoint every decoder layer (keep its input, recompute its "
        "activations in backward: one more forward pass, a layer's activations instead of all "
        "of them); auto = true when the activations kept without it pass "
        "rpeg.perf.units.RECOMPUTE_MEMORY_SHARE of a device's memory",
    )
    offload: bool = Field(False, description="offload this unit's state to host memory when idle")
    engine: Engine = "auto"
    gpu_memory_utilization: float = Field(
        defaults.GPU_MEMORY_UTILIZATION,
        gt=0.0,
        le=1.0,
        description="generation: KV-cache budget share",
    )
    enforce_eager: bool = Field(
        False,
        description="generation: decode without CUDA graphs (vLLM's enforce_eager; verl's "
        "rollout default before August 2025): every decode step launches each layer's "
        "kernels from the host, which bounds a small batch's step; false = the engine's own "
        "(vLLM captures CUDA graphs on GPUs; its CPU build and RPEG's torch engine run eager)",
    )
    seq_packing: bool | Literal["auto"] = Field(
        "auto",
        description="forward/backward passes: pack each micro-batch's rows end to end without "
        "padding, the micro-batch cut by a token budget of micro_batch_size x the longest "
        "sequence (prompt cap + response cap; NeMo-RL sequence packing, verl "
        "use_remove_padding + use_dynamic_bsz); false = micro_batch_size rows padded to their "
        "longest; auto = true where RPEG's runtime packs (pp = 1 and cp = 1: pipeline stages "
        "and context-parallel shards run padded rows; a model without linear-attention "
        "layers). docs/packing.md",
    )
    reshard_after_forward: bool | Literal["auto"] = Field(
        "auto",
        description="FSDP training: true frees each block's gathered parameters after its "
        "forward and gathers them again in backward (ZeRO-3, two all-gathers per "
        "micro-batch); false keeps them gathered from forward to backward (one all-gather, "
        "the rank's whole unsharded shard resident during the pass); auto = false when that "
        "extra fits rpeg.perf.units.GATHERED_MEMORY_SHARE of a device's memory",
    )

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, v: Any) -> tuple[int, ...]:
        return parse_devices(v)

    @field_validator("reshard_after_forward", "recompute", "seq_packing", mode="before")
    @classmethod
    def _reshard(cls, v: Any) -> bool | str:
        if isinstance(v, bool) or v == "auto":
            return v
        raise ValueError(f"got {v!r}; allowed: true, false, auto")

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def packs(self, model: Any = None) -> bool:
        """Whether the unit's passes run packed micro-batches: ``seq_packing`` as given, or
        ``auto`` resolved for the policy ``model`` (a ModelSpec, or None: unknown) -- packed
        at pp 1 and cp 1 unless the model has linear-attention layers, whose recurrent
        state would run from one packed sequence into the next (docs/packing.md)."""
        if isinstance(self.seq_packing, bool):
            return self.seq_packing
        return self.pp == 1 and self.cp == 1 and getattr(model, "linear_attn", None) is None

    @property
    def dp_size(self) -> int:
        return self.dp or max(1, len(self.devices) // (self.tp * self.pp * self.cp))

    @model_validator(mode="after")
    def _divides(self) -> UnitPlan:
        n = len(self.devices)
        model_par = self.tp * self.pp * self.cp
        if n % model_par:
            raise ValueError(f"tp*pp*cp={model_par} must divide the {n} devices")
        if self.dp and self.dp * model_par != n:
            raise ValueError(f"dp*tp*pp*cp={self.dp * model_par} must equal the {n} devices")
        if (n // self.pp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide devices/pp={n // self.pp}")
        return self


class GraphRef(_Base):
    """Which graph the plan executes: a builder and its options, or inline IR YAML."""

    builder: str | None = "grpo"
    options: dict[str, Any] = Field(default_factory=dict, description="builder kwargs / transforms")
    inline: dict[str, Any] | None = Field(None, description="inline IR (rpeg.ir YAML form)")


class Plan(_Base):
    """An execution plan for one RL step (see module docstring)."""

    cluster: str = "local-cpu"
    num_nodes: int | None = Field(None, ge=1, description="None = the catalog's size")
    model: str = Field("rpeg-tiny", description="catalog model for the actor (and trunks)")
    graph: GraphRef = Field(default_factory=GraphRef)
    staleness: int = Field(
        defaults.MAX_STALENESS, ge=0, description="bound k on policy lag (0 = on-policy)"
    )
    partial_rollout: bool = False
    units: dict[str, UnitPlan]
    streaming: bool = Field(
        False,
        description="k=0 across pools: trainer consumes mini-batches as soon as they are generated",
    )

    @model_validator(mode="after")
    def _units(self) -> Plan:
        if not self.units:
            raise ValueError("a plan needs at least one unit")
        return self

    # --- derived -------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return _num_devices_used(tuple(u.devices for u in self.units.values()))

    def colocated(self) -> list[frozenset[str]]:
        """Groups of units that share at least one device (connected components)."""
        return list(_colocated(tuple((n, u.devices) for n, u in self.units.items())))

    def with_inline_graph(self, graph: dict[str, Any]) -> Plan:
        """This plan executing ``graph`` (the plain-data IR, ``rpeg.ir.to_dict(g)``) inline."""
        return self.model_copy(update={"graph": self.graph.model_copy(update={"inline": graph})})

    # --- YAML ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump(mode="json", exclude_defaults=False)
        for name, u in d["units"].items():
            u["devices"] = format_devices(self.units[name].devices)
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "") -> Plan:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            from rpeg.config import problems_from_pydantic

            raise ConfigError(
                problems_from_pydantic(exc, cls), title=f"invalid plan {source}".strip()
            ) from None

    @classmethod
    def from_yaml(cls, text_or_path: str | Path) -> Plan:
        from rpeg.config import read_text_or_path, safe_yaml

        text, source = read_text_or_path(text_or_path)
        try:
            data = safe_yaml(text, source or "plan")
        except yaml.YAMLError as exc:
            raise ConfigError([Problem(source or "plan", f"not valid YAML: {exc}")]) from None
        if not isinstance(data, dict):
            raise ConfigError([Problem(source or "plan", "top level must be a mapping")])
        return cls.from_dict(data, source=source)


# --- layouts ---------------------------------------------------------------------------
_GEN_KINDS = {"generate", "reward"}


def _unit_names_and_kinds(graph: Any) -> list[tuple[str, set[str]]]:
    """(unit name, stage kinds) per execution unit of an IR graph (duck-typed)."""
    out = []
    for unit in graph.execution_units():
        stages = getattr(unit, "stages", None)
        if stages is None:  # a single Stage
            out.append((unit.name, {_kind(unit)}))
        else:
            kinds = set()
            for s in stages:
                kinds.add(_kind(graph_stage(graph, s) if isinstance(s, str) else s))
            out.append((unit.name, kinds))
    return out


def graph_stage(graph: Any, name: str) -> Any:
    for s in graph.stages:
        if s.name == name:
            return s
    raise KeyError(name)


def _kind(stage: Any) -> str:
    k = stage.kind
    return getattr(k, "value", str(k))


def colocated_plan(
    graph: Any,
    cluster: str = "local-cpu",
    *,
    num_devices: int | None = None,
    num_nodes: int | None = None,
    model: str = "rpeg-tiny",
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    cp: int = 1,
    gen_tp: int | None = None,
    gen_pp: int = 1,
    micro_batch_size: int = defaults.UNIT_MICRO_BATCH_SIZE,
    recompute: bool | Literal["auto"] = True,
    gpu_memory_utilization: float = defaults.COLOCATED_GPU_MEMORY_UTILIZATION,
    builder: str | None = None,
    builder_options: dict[str, Any] | None = None,
) -> Plan:
    """verl-style layout: every unit on all devices (time-shared), one train layout."""
    n = _num_devices(cluster, num_devices, num_nodes)
    devs = f"0-{n - 1}"
    gen = dict(tp=gen_tp or tp, pp=gen_pp, gpu_memory_utilization=gpu_memory_utilization)
    train = dict(tp=tp, pp=pp, ep=ep, cp=cp, micro_batch_size=micro_batch_size)
    return Plan(
        cluster=cluster,
        num_nodes=num_nodes,
        model=model,
        staleness=graph.staleness,
        graph=GraphRef(builder=builder, options=builder_options or {}),
        units=_unit_plans(
            graph,
            gen={**gen, "devices": devs, "offload": True},
            train={**train, "devices": devs, "recompute": recompute, "offload": True},
        ),
    )


def disaggregated_plan(
    graph: Any,
    cluster: str = "local-cpu",
    *,
    gen_devices: int,
    train_devices: int,
    num_nodes: int | None = None,
    model: str = "rpeg-tiny",
    gen_tp: int = 1,
    gen_pp: int = 1,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    cp: int = 1,
    micro_batch_size: int = defaults.UNIT_MICRO_BATCH_SIZE,
    recompute: bool | Literal["auto"] = True,
    partial_rollout: bool = False,
    gpu_memory_utilization: float = defaults.GPU_MEMORY_UTILIZATION,
    builder: str | None = None,
    builder_options: dict[str, Any] | None = None,
) -> Plan:
    """AReaL/NeMo-async layout: generation on devices [0, gen), everything else after."""
    k = graph.staleness
    gen = dict(tp=gen_tp, pp=gen_pp, gpu_memory_utilization=gpu_memory_utilization)
    train = dict(tp=tp, pp=pp, ep=ep, cp=cp, micro_batch_size=micro_batch_size)
    return Plan(
        cluster=cluster,
        num_nodes=num_nodes,
        model=model,
        staleness=k,
        partial_rollout=partial_rollout and k > 0,
        graph=GraphRef(builder=builder, options=builder_options or {}),
        units=_unit_plans(
            graph,
            gen={**gen, "devices": f"0-{gen_devices - 1}"},
            train={
                **train,
                "devices": f"{gen_devices}-{gen_devices + train_devices - 1}",
                "recompute": recompute,
            },
        ),
    )


def _unit_plans(graph: Any, *, gen: dict[str, Any], train: dict[str, Any]) -> dict[str, UnitPlan]:
    """A UnitPlan per execution unit: ``gen`` for units that generate (or score rollouts),
    ``train`` for the rest."""
    return {
        name: UnitPlan(**(gen if kinds & _GEN_KINDS else train))
        for name, kinds in _unit_names_and_kinds(graph)
    }


def _num_devices(cluster: str, num_devices: int | None, num_nodes: int | None) -> int:
    if num_devices:
        return num_devices
    from rpeg import specs

    return specs.cluster(cluster, num_nodes=num_nodes).num_devices
