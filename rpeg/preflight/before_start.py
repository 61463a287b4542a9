"""The one validation pass before anything starts (:func:`preflight`: every check of this
package, then the compiled step's problems, raised together) and :func:`load_config` (a
config's schema problems and its inline plan's, together)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, Problem, ProblemsError
from rpeg.preflight.gpus import check_plan_devices, plan_gpus
from rpeg.preflight.inputs import check_algorithm, check_generation_engine, check_model, check_task
from rpeg.preflight.machine import check_machine, check_scheduler_reachable
from rpeg.preflight.places import check_file_writable, check_places, check_resumed_layout

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep


def load_config(source: str | None) -> RunConfig:
    """The run config at ``source`` (a path, an fsspec URL or YAML text; None: the defaults).
    When it has problems and its ``plan`` section is inline, the plan's own problems (its
    schema and layout rules, as ``plan.<field>``) join them in the one error: otherwise a
    user would fix the config and only then learn of the plan's."""
    if source is None:
        return RunConfig()
    try:
        return RunConfig.from_yaml(source)
    except ConfigError as exc:
        extra = _inline_plan_problems(source)
        if not extra:
            raise
        raise ConfigError([*exc.problems, *extra], title=exc.title) from None


def _inline_plan_problems(source: str) -> list[Problem]:
    """Problems of the inline ``plan`` mapping of the YAML at ``source`` ([] if none)."""
    import yaml

    from rpeg.config import read_text_or_path, safe_yaml
    from rpeg.plan import Plan

    try:
        data = safe_yaml(read_text_or_path(source)[0])
    except (ConfigError, yaml.YAMLError):
        return []
    plan = data.get("plan") if isinstance(data, dict) else None
    if not isinstance(plan, dict):
        return []
    try:
        Plan.from_dict(plan)
    except ConfigError as exc:
        return [Problem(f"plan.{p.where}", p.what) for p in exc.problems]
    return []


def preflight(
    config: RunConfig,
    *,
    cluster_devices: int | None = None,
    local: bool = False,
    compile_plan: bool = True,
    output_files: dict[str, str | None] | None = None,
) -> Any:
    """Check everything; raise ConfigError listing all problems. Returns the compiled step
    (None with ``local`` or ``compile_plan=False``). ``cluster_devices``: the devices of an
    existing cluster (None = a LocalCluster on this machine). ``output_files``: files the
    command writes at the end (``{"--summary-json": path}``), checked writable now."""
    problems: list[Problem] = []
    for where, path in (output_files or {}).items():
        if path:
            problems += check_file_writable(path, where)
    problems += check_model(config)
    problems += check_algorithm(config)
    problems += check_task(config)
    problems += check_places(config, local)
    problems += check_generation_engine(config)
    from rpeg.runtime.actors.fault_points import fault_problems

    faults, notes = fault_problems()  # a test hook: checked now, ignored unless enabled
    problems += [Problem(where, what) for where, what in faults]
    for note in notes:
        import warnings

        warnings.warn(note, stacklevel=2)
    from rpeg.runtime.loggers import logger_problems

    problems += logger_problems(config)
    if not local:
        problems += check_machine(config, cluster_devices=cluster_devices)
        problems += check_scheduler_reachable(config.cluster.address)
    compiled = None
    if compile_plan and not local:
        from rpeg.compile import compile_plan as _compile
        from rpeg.specs.hf import priced_model

        try:  # the policy's shape, read here (compile reads no file)
            model = priced_model(config.model)
        except ProblemsError:  # check_model names the problem
            model = None
        try:
            compiled = _compile(None, config, cluster_devices=cluster_devices, model=model)
        except ProblemsError as exc:
            problems += list(exc.problems)
        if compiled is not None and not problems:
            problems += check_resumed_layout(config, compiled)
        if compiled is not None and not problems:
            problems += check_rank_memory(config, compiled, model, cluster_devices)
        if compiled is not None and config.cluster.address is None and cluster_devices is None:
            # a LocalCluster's workers see this machine's GPUs
            from rpeg.infra.devices import device_view

            if plan_gpus(compiled):
                views = {"local": device_view()}
                problems += check_plan_devices(config, compiled, views, per_worker=False)
    from rpeg.preflight.lora import check_lora

    problems += check_lora(config, compiled)  # model.lora: its targets (docs/lora.md)
    from rpeg.preflight.architecture import check_architecture

    problems += check_architecture(config, compiled)  # model type, tp (docs/models.md)
    if problems:
        raise ConfigError(problems, title="run refused before anything started")
    return compiled


def check_rank_memory(
    config: Any, compiled: CompiledStep, model: Any, cluster_devices: Any
) -> list[Problem]:
    """Each rank's predicted peak memory (rpeg.compile.memory) against what a worker has:
    ``cluster.worker_memory`` (``auto``: this machine's memory split over a LocalCluster's
    workers, as Dask splits it) on CPU workers, the GPU's memory on GPUs. A rank over it is
    refused now, naming its group and the numbers, instead of dying in its first step."""
    from rpeg.compile.memory import memory_problems, rank_peaks, worker_memory_gb

    try:
        peaks = rank_peaks(compiled, config, model)
    except ProblemsError:
        return []
    cpu = [p for p, g in zip(peaks, compiled.actor_groups, strict=True) if g.device_type == "cpu"]
    gpu = [p for p, g in zip(peaks, compiled.actor_groups, strict=True) if g.device_type != "cpu"]
    out = []
    if cpu:
        machine = None
        if config.cluster.address is None and cluster_devices is None:
            from distributed.system import MEMORY_LIMIT  # the machine's, or its cgroup's

            machine = MEMORY_LIMIT / 1e9
        limit = worker_memory_gb(config, machine)
        where = f"cluster.worker_memory ({config.cluster.worker_memory}, per worker)"
        out += memory_problems(cpu, limit, where)
    if gpu:
        from rpeg import specs

        try:
            hbm = specs.cluster(config.cluster.name).gpu.hbm_gb
        except Exception:  # noqa: BLE001 - an unknown cluster is check_machine's problem
            hbm = None
        out += memory_problems(gpu, hbm, f"a {config.cluster.name} GPU's memory")
    return out
