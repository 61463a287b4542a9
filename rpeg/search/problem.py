"""What the optimizer solves: a run config resolved to model, cluster, workload and
search-space options (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import ConfigError, Problem
from rpeg.ir import Graph, build
from rpeg.perf.calibration.run_lengths import configured_workload
from rpeg.perf.prediction import Workload
from rpeg.search.space import SearchSpace, SpaceOptions


# --- the problem ----------------------------------------------------------------------------
@dataclass(frozen=True)
class OwnSettings:
    """The unit settings of the config's own plan (its ``plan`` section; else the plan
    ``rpeg train`` runs: every unit at ``workload.micro_batch_size``, engine auto).
    :func:`default_space` always holds them, so the cell of the user's own plan is searched
    with its layouts and the planner never picks a plan it prices slower than the user's."""

    micro_batch_sizes: tuple[int, ...] = ()
    engines: tuple[str, ...] = ()
    tp: tuple[int, ...] = ()


def own_settings(config: Any) -> OwnSettings:
    """:class:`OwnSettings` of a :class:`rpeg.config.RunConfig`."""
    from rpeg.plan import Plan

    if config.plan is None:
        return OwnSettings((config.workload.micro_batch_size,), ("auto",), (1,))
    p = Plan.from_yaml(config.plan) if isinstance(config.plan, str) else config.plan
    p = Plan.from_dict(p) if isinstance(p, dict) else p
    units = list(p.units.values())
    return OwnSettings(
        tuple(sorted({u.micro_batch_size for u in units})),
        tuple(sorted({u.engine for u in units})),
        tuple(sorted({u.tp for u in units})),
    )


@dataclass
class PlanProblem:
    """Everything fixed by the user: graph family, model, cluster, workload, staleness bound."""

    algorithm: str
    builder_options: dict[str, Any]
    base: Graph
    model: Any
    cluster: Any
    workload: Workload
    num_devices: int
    max_staleness: int
    own: OwnSettings = field(default_factory=OwnSettings)

    @property
    def max_seq_tokens(self) -> int:
        w = self.workload
        return int(
            w.max_seq_tokens
            or (w.max_prompt_tokens or w.mean_prompt_tokens) + w.max_response_tokens
        )

    def describe(self) -> str:
        from rpeg.specs.models import format_params

        w, m = self.workload, self.model
        return (
            f"{self.algorithm.upper()} on {m.name} ({format_params(m.params)} params), {self.num_devices} x {self.cluster.gpu.name} "
            f"({self.cluster.name}, {self.cluster.num_nodes} nodes), {w.num_prompts} prompts x "
            f"{w.samples_per_prompt} samples, max {w.max_response_tokens} response tokens, k <= {self.max_staleness}"
        )


def default_space(prob: PlanProblem) -> SpaceOptions:
    """The space for a problem: on the CPU profile only what the CPU runtime executes
    (data parallelism: tp = pp = cp = 1, engine auto); always the micro-batch sizes,
    engines and tp degrees of the config's own plan (:class:`OwnSettings`) besides."""
    so = SpaceOptions(max_staleness=prob.max_staleness)
    if prob.cluster.gpu.name == "cpu":
        so = so.restrict(tp=(1,), pp=(1,), cp=(1,), gen_pp=(1,), engines=("auto",))
    return so.restrict(
        micro_batch_sizes=tuple(sorted({*so.micro_batch_sizes, *prob.own.micro_batch_sizes})),
        engines=tuple(dict.fromkeys((*so.engines, *prob.own.engines))),
        tp=tuple(sorted({*so.tp, *prob.own.tp})),
    )


def search_space(prob: PlanProblem, options: SpaceOptions | None = None) -> SearchSpace:
    """The search space of ``prob`` under ``options`` (default: :func:`default_space`)."""
    return SearchSpace(
        prob.base,
        prob.cluster,
        prob.model,
        num_devices=prob.num_devices,
        max_seq_tokens=prob.max_seq_tokens,
        options=options or default_space(prob),
        workload=prob.workload,
    )


def resolve_model(name: str) -> Any:
    """Catalog model by name; ``qwen2.5-32b`` also finds ``qwen2.5-32b-instruct``, and a
    checkpoint name as published (``Qwen/Qwen2.5-7B-Instruct``, ``Meta-Llama-3.1-8B``,
    ``...-FP8``) the entry it names (:func:`rpeg.perf.validation.row_cells.catalog_match`).
    Never a stand-in: a plan needs the real architecture."""
    from rpeg import specs
    from rpeg.perf.validation.row_cells import catalog_match

    table = specs.models()
    if name in table:
        return table[name]
    for alt in (f"{name}-instruct", name.lower(), f"{name.lower()}-instruct"):
        if alt in table:
            return table[alt]
    found = catalog_match(name)
    if found is not None and found[0] in table:
        return table[found[0]]
    return specs.model(name)  # raises SpecError listing the known models


def _check_context(model: Any, workload: Any) -> None:
    """A response cap over the model's context (``max_position``, where the catalog or the
    folder's config.json says it) is refused: no sample of that length can exist (issue 44:
    a cap 30,000x the context was priced silently)."""
    ctx = int(getattr(model, "max_position", 0) or 0)
    if ctx and workload.max_response_tokens > ctx:
        raise ConfigError(
            [
                Problem(
                    "workload.max_response_tokens",
                    f"{workload.max_response_tokens} tokens is over the context of "
                    f"{getattr(model, 'name', 'the model')} ({ctx} tokens); at most {ctx}",
                )
            ]
        )


def problem_from_config(config: Any) -> PlanProblem:
    """Build the :class:`PlanProblem` of a :class:`rpeg.config.RunConfig`."""
    from rpeg.perf.time_sharing import run_cluster
    from rpeg.specs.hf import priced_model

    # model.path's own config.json (never the built-in tiny model's shape), else the catalog
    model = priced_model(config.model, catalog=resolve_model)
    _check_context(model, config.workload)
    # a CPU cluster keeps the machine's cores, its workers time-share them (as predict prices)
    cl = run_cluster(config.cluster.name, config.cluster.num_devices)
    n = config.cluster.num_devices or cl.num_devices
    algo = config.algorithm.name
    opts: dict[str, Any] = {
        "use_reference": config.algorithm.use_reference,
        "group_size": config.workload.samples_per_prompt,
    }
    if config.task.multiturn.env:  # the env stage (rpeg.compile.graph_from_config does too)
        opts["multiturn"] = True
    base = build(algo, **opts)
    return PlanProblem(
        algorithm=algo,
        builder_options=opts,
        base=base,
        model=model,
        cluster=cl,
        # LoRA: perf.lora; multi-turn: perf.turns; lengths `rpeg calibrate` kept for the model
        # and task where the config states none (perf.calibration.run_lengths)
        workload=configured_workload(config, cl.name),
        num_devices=n,
        max_staleness=config.runtime.max_staleness,
        own=own_settings(config),
    )
