"""What the pipeline tests run on spawned gloo ranks (fp32): the built-in tiny model widened to
8 layers, the sharding tests' synthetic batch, a single-process reference and the per-rank
bodies. Kept out of the test module so that the spawned children import only this file and
``sharding_cases``."""

from __future__ import annotations

import io
import traceback

import sharding_cases as S
import torch

LAYERS = 8


def config(**over):
    base = {"workload.micro_batch_size": 2, "optim.grad_clip": 1.0}
    base.update(over)
    return S.config(**base)


def model():
    from rpeg.runtime.model_io import create_tiny

    return create_tiny(seed=0, num_hidden_layers=LAYERS)


def _snapshot_grads(worker) -> dict:
    """Wrap the optimizer's step to keep the (clipped) gradients of its first call."""
    seen: dict = {}
    names = {id(p): n for n, p in worker.lm.named_parameters()}
    step = worker.optimizer.step

    def wrapped(*a, **kw):
        if not seen:
            for g in worker.optimizer.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        seen[names[id(p)]] = p.grad.detach().clone()
        return step(*a, **kw)

    worker.optimizer.step = wrapped
    return seen


def _one_step(w, b) -> dict:
    """``b``'s old log-probs, then one train step of ``w`` on it: the log-probs, the step's
    metrics, the (clipped) gradients and the weights after, each gathered whole (tensor- or
    FSDP-sharded ones: a collective every rank makes; plain tensors copied)."""
    lp = w.compute_logprobs(b)
    b = b.replace(old_logprobs=lp, sample_logprobs=lp)
    grads = _snapshot_grads(w)
    metrics = w.train_step(b)
    return {
        "logprobs": lp,
        "metrics": metrics,
        "grads": {k: _full(v) for k, v in grads.items()},
        "weights": {k: _full(v) for k, v in w.lm.state_dict().items()},
    }


def reference(cfg, rows=None) -> dict:
    """One process: old log-probs, one train step: metrics, gradients, weights after."""
    m, tok = model()
    w = S.policy(cfg, m, tok)
    b = S.batch(0)
    if rows is not None:
        b = b.select(rows)
    return _one_step(w, b)


def pipeline_case(cfg, pp: int, dp: int, schedule: str, tp: int = 1, *, rank: int) -> dict:
    """This rank's share of one step at ``pp x dp``: its stage's log-probs (every pipeline
    rank returns the last stage's), the step's metrics, the gradients and weights of the
    parameters it holds."""
    from rpeg.runtime.parallel import LOCAL, process_group_reduce
    from rpeg.runtime.pipeline import PipeLayout, apply_pipeline, new_groups

    lay = PipeLayout(pp=pp, dp=dp, tp=tp, schedule=schedule)
    groups = new_groups(lay, rank)
    m, tok = model()
    reduce = process_group_reduce(groups["dp"]) if dp > 1 else LOCAL
    w = S.policy(cfg, m, tok, reduce=reduce)
    pipe = apply_pipeline(w, lay, rank, groups)
    b = S.batch(0).select(S.rows_of(lay.dp_index(rank), dp))
    return {
        **_one_step(w, b),
        "layers": pipe.owned_layers(),
        "dp_index": lay.dp_index(rank),
        "tp_sharded": sorted(k for k, v in w.lm.state_dict().items() if hasattr(v, "full_tensor")),
    }


def _full(t):
    """A tensor-parallel shard gathered (a collective over tp), or a plain copy."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def reference_steps(cfg, steps: int = 2) -> list[dict]:
    """One process, ``steps`` train steps on ``batch(s)``: each step's metrics."""
    m, tok = model()
    w = S.policy(cfg, m, tok)
    out = []
    for s in range(steps):
        b = S.with_old_logprobs(S.batch(s), w)
        out.append(w.train_step(b))
    return out


def _pipelined(cfg, lay, rank: int, groups, meta: bool = False):
    from rpeg.runtime.parallel import LOCAL, process_group_reduce
    from rpeg.runtime.pipeline import apply_pipeline

    whole, tok = model()
    m, source = whole, None
    if meta:
        from rpeg.runtime.materialize import ModuleSource, meta_causal_lm

        m, source = meta_causal_lm(whole.config, torch.float32), ModuleSource(whole)
    reduce = process_group_reduce(groups["dp"]) if lay.dp > 1 else LOCAL
    w = S.policy(cfg, m, tok, reduce=reduce)
    pipe = apply_pipeline(w, lay, rank, groups, source=source, device=torch.device("cpu"))
    held = sum(p.numel() * p.element_size() for p in w.lm.parameters())
    if source is not None:
        source.close()
    return w, pipe, whole, held


def meta_case(cfg, rank: int) -> dict:
    """pp=2 built on the meta device and filled from a source with this rank's stage only:
    bytes held, the gathered full weights, and one step (as :func:`pipeline_case`)."""
    from rpeg.runtime.pipeline import PipeLayout, full_state_dict, new_groups

    lay = PipeLayout(pp=2, schedule="1f1b")
    groups = new_groups(lay, rank)
    w, pipe, whole, held = _pipelined(cfg, lay, rank, groups, meta=True)
    full_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    initial = {k: v.clone() for k, v in whole.state_dict().items()}
    del whole
    gathered = full_state_dict(pipe)
    return {
        "held": held,
        "full_bytes": full_bytes,
        "gathered_ok": set(gathered) == set(initial)
        and all(torch.equal(gathered[k], initial[k]) for k in initial),
        **_one_step(w, S.batch(0)),
        "layers": pipe.owned_layers(),
        "dp_index": 0,
    }


def resume_case(cfg, url: str, rank: int) -> dict:
    """Step 1 at dp=2 (replicas), a DCP checkpoint, a fresh pp=2 worker loads it and runs
    step 2 on the whole batch: its metrics."""
    from rpeg.runtime.actors.shard_checkpoint import (
        load_shards,
        restore_extras,
        save_shards,
        worker_extras,
        worker_roles,
    )
    from rpeg.runtime.mesh import Layout, build_mesh
    from rpeg.runtime.parallel import process_group_reduce
    from rpeg.runtime.pipeline import PipeLayout, new_groups

    dp = Layout(dp=2, tp=1, fsdp=False)
    mesh = build_mesh(dp)
    m, tok = model()
    w = S.policy(cfg, m, tok)
    w.apply_layout(dp, mesh, process_group_reduce(mesh.get_group("dp")), device=torch.device("cpu"))
    b = S.with_old_logprobs(S.batch(0).select(S.rows_of(rank, 2)), w)
    first = w.train_step(b)
    save_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    del w
    lay = PipeLayout(pp=2, schedule="1f1b")
    v, pipe, _, _ = _pipelined(cfg, lay, rank, new_groups(lay, rank))
    extras = load_shards(url, worker_roles(actor=v), worker_extras(actor=v))
    restore_extras(extras, actor=v)
    b2 = S.with_old_logprobs(S.batch(1), v)
    return {"first": first, "metrics": v.train_step(b2), "version": v.policy_version}


def context_case(cfg, dp: int = 1, *, rank: int) -> dict:
    """One step at cp = world / dp (cp innermost: rank ``r`` is cp index ``r % cp`` of dp
    index ``r // cp``); each dp index holds its whole prompt groups."""
    import torch.distributed as dist

    from rpeg.runtime.context_parallel import apply_context_parallel
    from rpeg.runtime.parallel import LOCAL, process_group_reduce

    world = dist.get_world_size()
    cp = world // dp
    cp_group = dp_group = None
    for d in range(dp):  # every rank creates every group, in the same order
        g = dist.new_group(list(range(d * cp, (d + 1) * cp)))
        cp_group = g if rank // cp == d else cp_group
    for c in range(cp):
        g = dist.new_group(list(range(c, world, cp))) if dp > 1 else None
        dp_group = g if rank % cp == c else dp_group
    m, tok = model()
    w = S.policy(cfg, m, tok, reduce=process_group_reduce(dp_group) if dp > 1 else LOCAL)
    apply_context_parallel(w, cp_group, rank % cp, cp, dp_group=dp_group)
    return _one_step(w, S.batch(0).select(S.rows_of(rank // cp, dp)))


def _context_fsdp_worker(cfg, dp: int, rank: int, meta: bool = False):
    """A policy at fsdp x cp (cp = world / dp, cp innermost) as the ranks lay it out
    (rpeg.runtime.parallel_layout.layout_groups: the cp and dp groups and the 1-D mesh of all
    ranks): FSDP2 over the dp x cp ranks; ``meta``: built on the meta device and filled from
    the whole model. Returns (worker, layout, the whole model's parameter bytes)."""
    import torch.distributed as dist

    from rpeg.runtime.context_parallel import apply_context_parallel
    from rpeg.runtime.mesh import Layout
    from rpeg.runtime.parallel import LOCAL, process_group_reduce
    from rpeg.runtime.parallel_layout import layout_groups

    cp = dist.get_world_size() // dp
    lay = Layout(dp=dp, cp=cp, fsdp=True)
    groups = layout_groups(lay, rank)
    whole, tok = model()
    full_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    m, source = whole, None
    if meta:
        from rpeg.runtime.materialize import ModuleSource, meta_causal_lm

        m, source = meta_causal_lm(whole.config, torch.float32), ModuleSource(whole)
    reduce = process_group_reduce(groups["dp"]) if dp > 1 else LOCAL
    w = S.policy(cfg, m, tok, reduce=reduce)
    apply_context_parallel(
        w,
        groups["cp"],
        lay.cp_index(rank),
        cp,
        groups["dp"],
        fsdp=(lay, groups["fsdp_mesh"]),
        source=source,
        device=torch.device("cpu"),
    )
    if source is not None:
        source.close()
    return w, lay, full_bytes


def context_fsdp_case(cfg, dp: int = 1, meta: bool = False, *, rank: int) -> dict:
    """:func:`context_case` with the parameters sharded by FSDP2 over the dp x cp ranks: the
    bytes this rank holds, then one step (gradients and weights gathered whole)."""
    from rpeg.runtime.sharding import param_bytes_local

    w, lay, full_bytes = _context_fsdp_worker(cfg, dp, rank, meta)
    held = param_bytes_local(w.lm)
    return {
        "held": held,
        "full_bytes": full_bytes,
        "sharded": w.shards.layout.sharded,
        **_one_step(w, S.batch(0).select(S.rows_of(lay.dp_index(rank), dp))),
    }


def context_fsdp_resume_case(cfg, url: str, rank: int) -> dict:
    """Step 1 at fsdp cp=2 (two ranks, the whole batch), a DCP checkpoint, a fresh dp=2
    worker (replicas) loads it and runs step 2 on its half of the batch: its metrics."""
    from rpeg.runtime.actors.shard_checkpoint import (
        load_shards,
        restore_extras,
        save_shards,
        worker_extras,
        worker_roles,
    )
    from rpeg.runtime.mesh import Layout, build_mesh
    from rpeg.runtime.parallel import process_group_reduce

    w, _, _ = _context_fsdp_worker(cfg, 1, rank)
    first = w.train_step(S.with_old_logprobs(S.batch(0), w))
    save_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    del w
    dp = Layout(dp=2, tp=1, fsdp=False)
    mesh = build_mesh(dp)
    m, tok = model()
    v = S.policy(cfg, m, tok)
    v.apply_layout(dp, mesh, process_group_reduce(mesh.get_group("dp")), device=torch.device("cpu"))
    extras = load_shards(url, worker_roles(actor=v), worker_extras(actor=v))
    restore_extras(extras, actor=v)
    b2 = S.with_old_logprobs(S.batch(1).select(S.rows_of(rank, 2)), v)
    return {"first": first, "metrics": v.train_step(b2), "version": v.policy_version}


def body(rank: int, world: int, port: int, cases: list, q) -> None:
    """Run ``cases`` (``(name, function name here, args)``) in order on this rank."""
    import torch.distributed as dist

    try:
        S._init(rank, world, port)
        for name, fn, args in cases:
            res = globals()[fn](*args, rank=rank)
            buf = io.BytesIO()
            torch.save(res, buf)  # bytes: shared-memory tensors die with this process
            q.put((name, rank, buf.getvalue()))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        q.put(("error", rank, traceback.format_exc()))


def spawn(world: int, cases: list, port: int, timeout_s: float = 300.0) -> dict:
    """Run ``cases`` (name, function name here, args) on ``world`` spawned ranks."""
    return S.run_spawned(body, world, cases, port, timeout_s)
