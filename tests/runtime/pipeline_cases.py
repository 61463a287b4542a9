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


def reference(cfg, rows=None) -> dict:
    """One process: old log-probs, one train step: metrics, gradients, weights after."""
    m, tok = model()
    w = S.policy(cfg, m, tok)
    b = S.batch(0)
    if rows is not None:
        b = b.select(rows)
    lp = w.compute_logprobs(b)
    b = b.replace(old_logprobs=lp, sample_logprobs=lp)
    grads = _snapshot_grads(w)
    metrics = w.train_step(b)
    return {
        "logprobs": lp,
        "metrics": metrics,
        "grads": grads,
        "weights": {k: v.clone() for k, v in w.lm.state_dict().items()},
    }


def pipeline_case(cfg, pp: int, dp: int, schedule: str, rank: int, tp: int = 1) -> dict:
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
    lp = w.compute_logprobs(b)
    b = b.replace(old_logprobs=lp, sample_logprobs=lp)
    grads = _snapshot_grads(w)
    metrics = w.train_step(b)
    return {
        "logprobs": lp,
        "metrics": metrics,
        "grads": grads,
        "weights": {k: v.clone() for k, v in w.lm.state_dict().items()},
        "layers": pipe.owned_layers(),
        "dp_index": lay.dp_index(rank),
    }


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
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=body, args=(r, world, port, cases, q)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict = {}
    try:
        for _ in range(world * len(cases)):
            name, rank, res = q.get(timeout=timeout_s)
            if name == "error":
                raise AssertionError(f"rank {rank} failed:\n{res}")
            out.setdefault(name, {})[rank] = torch.load(io.BytesIO(res), weights_only=True)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out
