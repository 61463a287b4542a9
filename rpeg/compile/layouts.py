"""The layout of each actor group (docs/runtime.md "Compile"): its training unit gives
``tp``, ``dp`` and ``fsdp`` (engine ``fsdp``), its generate unit ``gen_tp``, ``gen_engine``
and ``gen_memory_utilization``; a group without a training unit takes its layout from its
generate unit (else its first unit). A forward-only unit (log-probs, values) whose tp
differs from its group's runs on the group's layout (a group holds each role in one shard
layout) and the replacement is listed in the step's notes. The device type and dtype come
from the cluster catalog and the workload's precision; the model's shape from the spec the
caller passes (read from a model folder by the caller) or the catalog. Pure: reads no file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast, get_args

from rpeg.compile.step import (
    FORWARD_KINDS,
    SUPPORTED_ROLES,
    TRAINABLE_KINDS,
    DeviceType,
    Dtype,
    GroupSpec,
)
from rpeg.errors import Problem
from rpeg.ir import StageKind
from rpeg.plan.schema import trains_fsdp

SHAPE_KEYS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


@dataclass
class GroupDraft:
    """A group while the compiler collects its units (frozen into a GroupSpec at the end)."""

    name: str
    devices: tuple[int, ...]
    roles: list[str] = field(default_factory=list)
    trainable: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Layouts:
    """The groups with their layouts, and what the layout step found."""

    groups: tuple[GroupSpec, ...]
    notes: tuple[str, ...]
    problems: tuple[Problem, ...]


def policy_model(config: Any, model: Any = None) -> Any:
    """The policy's catalog spec (:class:`rpeg.specs.models.ModelSpec`): ``model`` as the
    caller read it (a model folder's ``config.json``: :func:`rpeg.specs.hf.priced_model`),
    else the catalog entry of ``model.name``; None when neither is known. Reads no file."""
    if model is not None:
        return model
    from rpeg import specs
    from rpeg.errors import RpegError
    from rpeg.specs.hf import TINY_NAME, tiny_model

    m = config.model
    if m.path is None and m.tiny_shape and m.name == TINY_NAME:
        return tiny_model(m.tiny_shape)  # the built-in model at the shape that runs
    try:
        return specs.model(config.model.name)
    except RpegError:  # a name the catalog lacks: nothing to check the layout against
        return None


def model_shape(config: Any, model: Any = None) -> dict[str, int]:
    """Heads, kv heads and MLP width of the run's policy (:func:`policy_model`), with the
    built-in tiny model's ``model.tiny_shape`` overrides."""
    m = config.model
    spec = policy_model(config, model)
    out: dict[str, int] = {}
    if spec is not None:
        out = {
            "num_attention_heads": int(spec.heads),
            "num_key_value_heads": int(getattr(spec, "kv_heads", None) or spec.heads),
            "intermediate_size": int(spec.ffn_hidden),
        }
    if m.path is None and m.tiny_shape:
        out.update({k: int(v) for k, v in m.tiny_shape.items() if k in SHAPE_KEYS})
    return out


def _keeps_gathered(config: Any, up: Any, dtype: str, model: Any) -> bool:
    """The training unit ``up``'s ``reshard_after_forward`` resolved: an explicit bool as
    given; ``auto`` by the performance model's rule (:func:`rpeg.perf.units.keeps_gathered`:
    the gathered extra fits a share of the cluster's device memory), resharding (the
    memory-safe choice) when the model or cluster cannot be sized."""
    from rpeg import specs
    from rpeg.errors import RpegError
    from rpeg.perf.units import gathered_extra_gb, keeps_gathered, params_per_device

    setting = up.reshard_after_forward
    if setting != "auto":
        return not setting
    try:
        device_gb = specs.cluster(config.cluster.name).gpu.usable_hbm_gb
    except RpegError:  # an unknown cluster (refused by _device_type first)
        return False
    if model is None:
        return False
    dp = max(1, up.num_devices // (up.tp * up.pp))
    wbytes = 4.0 if dtype == "float32" else 2.0
    extra = gathered_extra_gb(params_per_device(model, up.tp, up.pp, up.ep), wbytes, dp)
    return keeps_gathered(setting, extra, device_gb)


def _recomputes(config: Any, up: Any, model: Any) -> bool:
    """The training unit ``up``'s ``recompute`` resolved: an explicit bool as given; ``auto``
    by the performance model's rule (:func:`rpeg.perf.units.recomputes`: the activations
    one micro-batch keeps without recompute, over a share of the device's memory); no
    recompute when the model or cluster cannot be sized."""
    from rpeg import specs
    from rpeg.errors import RpegError
    from rpeg.perf.calibration import Calibration
    from rpeg.perf.units import full_activation_bytes, recomputes

    setting = up.recompute
    if setting != "auto":
        return bool(setting)
    try:
        device_gb = specs.cluster(config.cluster.name).gpu.usable_hbm_gb
    except RpegError:
        return False
    if model is None:
        return False
    w = config.workload
    tokens = up.micro_batch_size * (w.max_prompt_tokens + w.max_response_tokens)
    if w.max_tokens_per_micro_batch:
        tokens = min(tokens, w.max_tokens_per_micro_batch)
    act = full_activation_bytes(model, tokens / up.cp, up.tp, up.pp, 1.0, Calibration())
    return recomputes(setting, act / 1e9, device_gb)


def _device_type(config: Any) -> DeviceType:
    """``cuda`` unless the catalog cluster's device is the CPU. An unknown cluster name is
    the catalog's error (a SpecError naming the known clusters), never a silent ``cpu``."""
    from rpeg import specs

    cl = specs.cluster(config.cluster.name)
    return "cpu" if cl.gpu.name == "cpu" else "cuda"


#: workload.precision -> compute dtype name (the names themselves are accepted too)
PRECISION_DTYPES: dict[str, Dtype] = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
}


def compute_dtype_name(precision: str, device_type: str, model_dtype: str = "float32") -> Dtype:
    """The one rule for the dtype a role computes in: ``workload.precision`` on
    ``device_type`` -- fp32, bf16 and fp16 as named; otherwise (``auto``; fp8, which has no
    fp8 matmuls here) bf16 on CUDA for an fp32 checkpoint, else the checkpoint's
    ``model.dtype``. The compiler writes it into each group's ``dtype``; the local trainer,
    which compiles no group, calls it directly."""
    name = PRECISION_DTYPES.get(str(precision))
    if name is not None:
        return name
    if device_type == "cuda" and model_dtype == "float32":
        return "bfloat16"
    if model_dtype not in get_args(Dtype):
        raise ValueError(f"model.dtype={model_dtype!r}: allowed {', '.join(get_args(Dtype))}")
    return cast(Dtype, model_dtype)


def _dtype(config: Any, device_type: str) -> Dtype:
    """The dtype a group computes in (:func:`compute_dtype_name`)."""
    return compute_dtype_name(str(config.workload.precision), device_type, str(config.model.dtype))


def gen_dp(g: GroupSpec) -> int:
    """Data-parallel size of generation on the group (``gen_tp`` = ``tp`` without one)."""
    return max(1, g.world_size // max(1, g.gen_tp))


def group_layouts(
    drafts: list[GroupDraft],
    kinds_of: dict[str, tuple[StageKind, ...]],
    plan: Any,
    config: Any,
    model: Any = None,
) -> Layouts:
    """Every group's layout from its units (module docstring), frozen as GroupSpecs.
    ``model``: the policy's spec as the caller read it (:func:`policy_model`)."""
    dev = _device_type(config)
    dtype = _dtype(config, dev)
    model = policy_model(config, model)
    shape = model_shape(config, model)
    notes: list[str] = []
    problems: list[Problem] = []
    out = []
    for d in drafts:
        g = _layout(d, kinds_of, plan, config, dev, dtype, model)
        out.append(g)
        notes += _tp_replacements(g, kinds_of, plan, problems)
        notes += _ep_layout(g, kinds_of, plan, model, problems)
        for t in sorted({g.tp, g.gen_tp}):
            if t > 1:
                problems += [
                    Problem(
                        f"actor group {g.name} (units {', '.join(g.units)})",
                        f"tp={t} does not divide the model's {key}={val}",
                    )
                    for key, val in shape.items()
                    if val % t
                ]
    return Layouts(tuple(out), tuple(notes), tuple(problems))


def _lead_units(
    units: tuple[str, ...], kinds_of: dict[str, tuple[StageKind, ...]]
) -> tuple[list[str], list[str], str]:
    """(training units, generate units, the unit that sets the group's layout)."""
    train = [n for n in units if set(kinds_of[n]) & set(TRAINABLE_KINDS)]
    gen = [n for n in units if StageKind.generate in kinds_of[n]]
    model_units = [n for n in units if set(kinds_of[n]) & FORWARD_KINDS]
    lead = train[0] if train else (gen[0] if gen else (model_units or list(units))[0])
    return train, gen, lead


def _layout(
    d: GroupDraft,
    kinds_of: dict[str, tuple[StageKind, ...]],
    plan: Any,
    config: Any,
    dev: DeviceType,
    dtype: Dtype,
    model: Any,
) -> GroupSpec:
    units = tuple(d.units)
    train, gen, lead = _lead_units(units, kinds_of)
    up = plan.units[lead]
    ws = len(d.devices)
    dp = max(1, ws // (up.tp * up.pp * up.cp))
    fsdp = bool(train) and trains_fsdp(
        str(up.engine), cuda=dev == "cuda", dp=dp, pp=up.pp, cp=up.cp
    )
    gp = plan.units[gen[0]] if gen else None
    return GroupSpec(
        name=d.name,
        devices=d.devices,
        world_size=ws,
        roles=tuple(sorted(d.roles, key=SUPPORTED_ROLES.index)),
        trainable=tuple(sorted(d.trainable, key=SUPPORTED_ROLES.index)),
        units=units,
        dp=dp,
        tp=up.tp,
        fsdp=fsdp,
        pp=up.pp,
        cp=up.cp,
        ep=up.ep,
        pp_schedule=up.pp_schedule,
        gen_tp=gp.tp if gp is not None else up.tp,
        gen_engine=None if gp is None else str(gp.engine),
        gen_memory_utilization=None if gp is None else gp.gpu_memory_utilization,
        gen_enforce_eager=gp is not None and gp.enforce_eager,
        reshard_after_forward=not (fsdp and dp > 1 and _keeps_gathered(config, up, dtype, model)),
        recompute=bool(train) and _recomputes(config, plan.units[train[0]], model),
        device_type=dev,
        dtype=dtype,
        backend="nccl" if dev == "cuda" else "gloo",
    )


def _ep_layout(
    g: GroupSpec,
    kinds_of: dict[str, tuple[StageKind, ...]],
    plan: Any,
    model: Any,
    problems: list[Problem],
) -> list[str]:
    """The group's ep: a problem when the runtime cannot split the model's experts at it
    (rpeg.search.ep_rules: a dense model, a family it does not split, experts or dp ep does
    not divide, tp/pp/cp > 1); notes for forward-only units whose own ep the group's
    replaces (a group holds each role in one layout); a second training ep is a problem."""
    from rpeg.search.ep_rules import ep_refusal

    where = f"actor group {g.name} (units {', '.join(g.units)})"
    _, why = ep_refusal(model, g.ep, tp=g.tp, pp=g.pp, cp=g.cp, dp=g.dp)
    if why:
        problems.append(Problem(where, why))
    train, gen, lead = _lead_units(g.units, kinds_of)
    notes = []
    for n in g.units:
        e = plan.units[n].ep
        if n in gen and g.ep > 1 and g.gen_tp == g.tp and e != g.ep:
            notes.append(
                f"plan.units.{n}.ep={e}: decodes on group {g.name}'s weights split at "
                f"ep={g.ep} (an all-to-all per MoE layer and token, the dp ranks in lockstep)"
            )
            continue
        if e == g.ep or not set(kinds_of[n]) & (FORWARD_KINDS | set(TRAINABLE_KINDS)):
            continue
        if n in train:
            problems.append(
                Problem(
                    f"plan.units.{n}.ep",
                    f"ep={e} but the group's training unit {train[0]} has ep={g.ep}: "
                    "two training layouts on one group",
                )
            )
        else:
            notes.append(
                f"plan.units.{n}.ep={e}: runs at group {g.name}'s layout ep={g.ep} "
                f"(set by {lead}; a group holds each role in one shard layout)"
            )
    return notes


def _tp_replacements(
    g: GroupSpec,
    kinds_of: dict[str, tuple[StageKind, ...]],
    plan: Any,
    problems: list[Problem],
) -> list[str]:
    """Notes for the units that run at the group's tp instead of their own; a second
    training layout on the group is a problem."""
    train, gen, lead = _lead_units(g.units, kinds_of)
    notes = []
    for n in g.units:
        t = plan.units[n].tp
        runs = g.gen_tp if n in gen else g.tp
        model = set(kinds_of[n]) & (FORWARD_KINDS | set(TRAINABLE_KINDS))
        if t == runs or n in gen or not model:
            continue
        if n in train:
            problems.append(
                Problem(
                    f"plan.units.{n}.tp",
                    f"tp={t} but the group's training unit {train[0]} has tp={g.tp}: "
                    "two training layouts on one group",
                )
            )
        else:
            notes.append(
                f"plan.units.{n}.tp={t}: runs at group {g.name}'s layout tp={runs} "
                f"(set by {lead}; a group holds each role in one shard layout)"
            )
    return notes
