"""A rank's roles at pipeline (pp) or context (cp) parallelism: the process groups of the
group's layout, the actor and the frozen reference cut into pipeline stages
(:func:`rpeg.runtime.pipeline.apply_pipeline`) or run on sequence shards
(:func:`rpeg.runtime.context_parallel.apply_context_parallel`), and the generation engine.

Called by ``RankModels._apply_layout`` (a rank's models: rpeg.runtime.actors.rank_models) for
a group with ``pp > 1`` or ``cp > 1`` (rank order: tp innermost, then cp, then pp, dp
outermost; the ``replica_ranks = tp * cp * pp`` ranks of one data-parallel index hold the
same rows).

Generation (decision, docs/parallelism.md "Stages and sequence shards in a run"): the engine
decodes at the generation layout ``(world / gen_tp, gen_tp)`` -- every rank its own prompts --
on weights it holds whole (or split at ``gen_tp``):

* under pp no rank holds the whole model, so the engine gets its own copy (compute dtype),
  filled from the weight source at construction and refreshed from the stages by the
  ``sync_weights`` stage (:func:`rpeg.runtime.pipeline.pipeline_weight_source`: each tensor
  broadcast from the stage that holds it, one at a time, into the sync's buckets);
* under cp every rank holds the whole model, so the engine decodes on the trained weights
  (the context-parallel forward hands a decode to the LM's own forward); at ``gen_tp > 1`` it
  gets a copy split at ``gen_tp``.

Training state at cp: replicas (every rank the whole model, gradients summed over cp and
averaged over dp: :class:`rpeg.runtime.context_parallel.ContextShards`) or, with ``fsdp``,
FSDP2 over all ``dp * cp`` ranks (:func:`rpeg.runtime.context_parallel.context_fsdp`: each
rank holds ``1/(dp cp)`` of the parameters, gradients and AdamW state; a role built on meta
is filled from the weight source after sharding).

Refused by name: a critic (value model) on such a group, FSDP over dp with pp (the stages
keep dp replicas), cp composed with tp or pp, a vLLM engine.
"""

from __future__ import annotations

from typing import Any

from rpeg.errors import ConfigError, Problem


def stage_layout(layout: Any) -> bool:
    """Whether ``layout`` (a :class:`rpeg.runtime.mesh.Layout`) runs pp or cp."""
    return layout.pp > 1 or layout.cp > 1


def stage_layout_problems(layout: Any, roles: Any = (), where: str = "plan") -> list[Problem]:
    """Why a group at ``layout`` holding ``roles`` cannot run its pp/cp (empty: it can)."""
    out: list[Problem] = []
    pp, cp = layout.pp, layout.cp
    if pp <= 1 and cp <= 1:
        return out
    deg = "pp" if pp > 1 else "cp"
    if "critic" in roles:
        out.append(
            Problem(
                f"{where}.{deg}",
                f"{deg}={getattr(layout, deg)} on a group with a critic (value model): the "
                f"critic is not pipelined or sequence-sharded; allowed: {deg}=1 for the "
                "critic's group",
            )
        )
    if layout.fsdp and layout.dp > 1 and pp > 1:
        out.append(
            Problem(
                f"{where}.engine",
                f"fsdp with pp={pp}: pipeline stages keep dp replicas; allowed: engine auto "
                "(replicas) with pp",
            )
        )
    if cp > 1 and (layout.tp > 1 or pp > 1):
        out.append(
            Problem(
                f"{where}.cp",
                f"cp={cp} with tp={layout.tp}, pp={pp}: context parallelism composes with "
                "dp only; allowed: tp=1 and pp=1 with cp > 1",
            )
        )
    return out


def layout_groups(layout: Any, rank: int) -> dict[str, Any]:
    """This rank's process groups (None: a group of one rank): ``pp``, ``dp``, ``tp``,
    ``tp_mesh`` (pipeline: :func:`rpeg.runtime.pipeline.new_groups`), or ``cp`` and ``dp``
    (cp blocks of consecutive ranks; dp: the ranks of one cp index) and, with ``fsdp``,
    ``fsdp_mesh``: the 1-D mesh of all ``dp * cp`` ranks FSDP2 shards over. Every rank calls
    ``new_group`` for every group in the same order."""
    import torch.distributed as dist

    if layout.cp <= 1:
        from rpeg.runtime.pipeline import PipeLayout, new_groups

        pl = PipeLayout(pp=layout.pp, dp=layout.dp, tp=layout.tp, schedule=layout.pp_schedule)
        return new_groups(pl, rank, layout.device_type)
    cp, dp = layout.cp, layout.dp
    mine: dict[str, Any] = {"pp": None, "dp": None, "tp": None, "tp_mesh": None, "cp": None}
    for d in range(dp):
        ranks = [d * cp + c for c in range(cp)]
        g = dist.new_group(ranks)
        if rank in ranks:
            mine["cp"] = g
    if dp > 1:
        for c in range(cp):
            ranks = [d * cp + c for d in range(dp)]
            g = dist.new_group(ranks)
            if rank in ranks:
                mine["dp"] = g
    if layout.fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        mine["fsdp_mesh"] = init_device_mesh(layout.device_type, (dp * cp,), mesh_dim_names=("dp",))
    return mine


def _own_engine(worker, gen_layout, source, device) -> None:
    """Give ``worker``'s torch engine a copy of its LM (compute dtype) at ``gen_layout``,
    made before the LM is cut into stages; filled from ``source`` when built on meta."""
    from rpeg.runtime.engines.torch_engine import TorchEngine
    from rpeg.runtime.lora import base_copy
    from rpeg.runtime.materialize import materialize, on_meta
    from rpeg.runtime.precision import frozen_dtype

    eng = worker.engine
    copy = base_copy(worker.lm).to(dtype=frozen_dtype(worker.compute_dtype))
    if gen_layout.tp > 1:
        from rpeg.runtime.mesh import build_mesh
        from rpeg.runtime.sharding import shard_roles

        shard_roles(copy, copy, gen_layout, build_mesh(gen_layout))
    if on_meta(copy):
        if source is None:
            raise ValueError("an engine copy built on the meta device needs a weight source")
        materialize(copy, device, source.fetch, "generator")
    worker.engine = TorchEngine(
        copy,
        eng.pad_id,
        eng.eos_id,
        policy_version=worker.policy_version,
        compute_dtype=worker.compute_dtype,
    )


def apply_stage_layout(rank_actor: Any) -> None:
    """Lay out a rank's roles (:class:`rpeg.runtime.actors.rank_models.RankModels`) at its
    group's pp or cp (module doc): sets its ``reduce`` (the dp group's batch statistics), the
    actor's and the reference's stages or sequence shards, the generation engine, and drops
    the weight source. Refuses, by name, what it does not run (:func:`stage_layout_problems`)."""
    from rpeg.runtime.engines.torch_engine import TorchEngine
    from rpeg.runtime.materialize import on_meta
    from rpeg.runtime.parallel import LOCAL, process_group_reduce

    r = rank_actor
    lay = r.layout
    probs = stage_layout_problems(lay, r.roles, where=f"group {r.group.name}")
    if r.actor is not None and r.actor.pending_engine is not None:
        probs.append(
            Problem(
                f"group {r.group.name}.gen_engine",
                "a vLLM engine beside pp or cp training is not run; allowed: torch",
            )
        )
    if probs:
        raise ConfigError(probs, title="layout refused")
    source, device = r.source, r.device
    if source is not None and hasattr(source, "consume"):
        source.consume = False  # the engine copy and the reference read it too
    groups = layout_groups(lay, r.rank)
    r.reduce = process_group_reduce(groups["dp"]) if lay.dp > 1 else LOCAL
    r.stage_groups = groups
    for name in ("actor", "reference"):
        wk = getattr(r, name)
        if wk is None:
            continue
        wk.reduce = r.reduce
        if name == "actor":
            eng = wk.engine
            shares = isinstance(eng, TorchEngine) and eng.model is wk.lm
            if shares and (lay.pp > 1 or r.gen_layout.tp > 1):
                _own_engine(wk, r.gen_layout, source, device)
        if lay.pp > 1:
            from rpeg.runtime.pipeline import PipeLayout, apply_pipeline

            pl = PipeLayout(pp=lay.pp, dp=lay.dp, tp=lay.tp, schedule=lay.pp_schedule)
            meta = on_meta(wk.lm)
            apply_pipeline(wk, pl, r.rank, groups, source=source if meta else None, device=device)
        else:
            from rpeg.runtime.context_parallel import apply_context_parallel

            # FSDP2 over the dp x cp ranks (built on meta: filled from the source)
            fs: dict[str, Any] = {}
            if lay.fsdp:
                fs = {"fsdp": (lay, groups["fsdp_mesh"]), "source": source, "device": device}
            cp_index = lay.cp_index(r.rank)
            apply_context_parallel(wk, groups["cp"], cp_index, lay.cp, groups["dp"], **fs)
            if not lay.fsdp:
                wk.shards.layout = lay  # whole weights on every rank (checkpoints: replicas)
    if r.actor is not None and r.actor.engine is not r.residency.engine:
        from rpeg.runtime.engines.residency import EngineResidency

        r.residency = EngineResidency(r.actor.engine, colocated="actor" in r.trainable)
    if source is not None:
        close = getattr(source, "close", None)
        if close is not None:
            close()
        r.source = None


def current_model(actor: Any) -> Any:
    """A whole model at ``actor``'s current weights to decode with outside the step
    (validation): the LM itself, or under pp -- where no rank holds the whole LM -- the
    engine's copy when it is at the actor's version, else a copy of it loaded from the
    stages (a collective over the pipeline group: every rank of the group calls it)."""
    if getattr(actor, "pipeline", None) is None:
        return actor.lm
    eng = actor.engine
    if int(eng.policy_version) == int(actor.policy_version):
        return eng.model
    import copy

    from rpeg.runtime.sharding import load_tensors

    model = copy.deepcopy(eng.model)
    meta, fetch = actor.weight_source()
    load_tensors(model, list(meta), fetch)
    return model
