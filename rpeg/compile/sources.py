"""Where a run's graph and plan come from: the config's algorithm (:func:`graph_from_config`),
a Plan (:func:`graph_from_plan`) or the default plan for the cluster (:func:`default_plan`);
:func:`resolve` picks among them. Pure."""

from __future__ import annotations

from typing import Any

from rpeg.errors import ConfigError, Problem


def graph_from_config(config: Any) -> Any:
    """The IR graph of ``config``'s algorithm: the run's staleness bound, and the algorithm
    parameters of the config (not the builders' presets), so the graph records what runs;
    with ``task.multiturn.env`` the env stage (docs/ir.md "Multi-turn: the env stage")."""
    from rpeg.ir import build, recipe, share_actor_critic

    a = config.algorithm
    opts: dict[str, Any] = {
        "staleness": config.runtime.max_staleness,
        "use_reference": a.use_reference,
        "kl_coef": a.kl_coef,
        "clip_low": a.clip_low,
        "clip_high": a.clip_high,
        "dual_clip": a.dual_clip,
        "dynamic_sampling": a.dynamic_sampling,
        "overlong_buffer": a.overlong_penalty_tokens or None,
        "loss_aggregation": a.loss_aggregation,
        "entropy_coef": a.entropy_coef,
        "group_size": config.workload.samples_per_prompt,
    }
    if config.task.multiturn.env:  # single-turn graphs leave the option out (goldens unchanged)
        opts["multiturn"] = True
    critic = recipe(a.name).critic  # PPO: the knobs of its critic
    if critic:
        opts.update(gamma=a.gamma, gae_lambda=a.gae_lambda, value_clip=a.value_clip)
    g = build(a.name, **opts)
    if critic and a.share_actor_critic:
        g = share_actor_critic(g)
    return g


def graph_from_plan(plan: Any, config: Any) -> Any:
    from rpeg.ir import bound_async, build, from_dict

    if plan.graph.inline:
        g = from_dict(plan.graph.inline)
    elif plan.graph.builder:
        g = build(plan.graph.builder, **plan.graph.options)
    else:
        g = graph_from_config(config)
    if g.staleness != plan.staleness:
        g = bound_async(g, plan.staleness)
    return g


def available_devices(config: Any) -> int:
    c = config.cluster
    return int(c.num_devices or c.n_workers)


def default_plan(graph: Any, config: Any) -> Any:
    """Sync (k=0) or one device: everything colocated on all devices (data parallel).
    k>0 with >=2 devices: rollout on the first half, training on the rest."""
    from rpeg.plan import colocated_plan, disaggregated_plan

    n = available_devices(config)
    # recompute "auto": the compiler checkpoints layers only where the activations kept
    # without it would crowd a device (rpeg.perf.units.recomputes); a small model trained
    # with it paid one more forward per micro-batch for nothing (benchmarks/bench_peer.py)
    kw = {"micro_batch_size": config.workload.micro_batch_size, "recompute": "auto"}
    if graph.staleness == 0 or n == 1:
        return colocated_plan(graph, num_devices=n, **kw)
    gen = max(1, n // 2)
    return disaggregated_plan(graph, gen_devices=gen, train_devices=n - gen, **kw)


def resolve(plan_or_graph: Any, config: Any) -> tuple[Any, Any]:
    """(graph, plan) from a Plan, a Graph, a plan dict/YAML path, or None (from config)."""
    graph, plan = _resolve(plan_or_graph, config)
    return graph, _running_model(plan, config)


def _running_model(plan: Any, config: Any) -> Any:
    """``plan`` naming the model that runs: the built-in model widened by
    ``model.tiny_shape`` is priced at that shape (rpeg.specs.hf.tiny_model), not as the
    catalog's default ``rpeg-tiny``."""
    from rpeg.specs.hf import TINY_NAME, tiny_model

    m = getattr(config, "model", None)
    if plan.model != TINY_NAME or m is None or m.path or not m.tiny_shape:
        return plan
    return plan.model_copy(update={"model": tiny_model(m.tiny_shape).name})


def _resolve(plan_or_graph: Any, config: Any) -> tuple[Any, Any]:
    from rpeg.ir import Graph
    from rpeg.plan import Plan

    obj = plan_or_graph
    if obj is None and config.plan is not None:
        obj = config.plan
    if isinstance(obj, str):
        obj = Plan.from_yaml(obj)
    elif isinstance(obj, dict):
        obj = Plan.from_dict(obj)
    if obj is None:
        graph = graph_from_config(config)
        return graph, default_plan(graph, config)
    if isinstance(obj, Graph):
        return obj, default_plan(obj, config)
    if isinstance(obj, Plan):
        return graph_from_plan(obj, config), obj
    raise ConfigError(
        [
            Problem(
                "plan", f"expected a Plan, Graph, plan dict or YAML path, got {type(obj).__name__}"
            )
        ]
    )
