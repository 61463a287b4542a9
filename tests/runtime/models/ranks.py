"""Run a case of this module on spawned gloo ranks (tests/runtime/models): each rank builds a
tiny model of tiny_folders.py, lays it out, runs one forward and backward of a fixed loss and
sends back the logits and the full (gathered) gradients."""

from __future__ import annotations

import io
import os
import traceback

import torch

IDS = torch.tensor([[1, 40, 41, 17, 42, 2, 5, 9], [1, 22, 7, 3, 3, 8, 60, 61]])


def model(model_type: str, **over):
    from transformers import AutoModelForCausalLM

    from tests.runtime.models.tiny_folders import tiny_hf_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_hf_config(model_type, **over)).train()


def loss_of(lm) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, a loss touching every parameter: next-token NLL + the router's term)."""
    from rpeg.runtime.model_io import moe

    kw = {"output_router_logits": True} if moe.routes(lm) else {}
    out = lm(input_ids=IDS, **kw)
    logp = out.logits[:, :-1].log_softmax(-1)
    nll = -logp.gather(-1, IDS[:, 1:, None]).mean()
    r = moe.capture(lm, out, None) if kw else None
    return out.logits.detach(), nll + moe.router_loss(r)


def full_grads(lm) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for n, p in lm.named_parameters():
        g = p.grad
        if g is None:
            continue
        out[n] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out


def reference(model_type: str, **over) -> dict:
    lm = model(model_type, **over)
    logits, loss = loss_of(lm)
    loss.backward()
    return {"logits": logits, "grads": full_grads(lm)}


def tp_case(rank: int, model_type: str, tp: int, **over) -> dict:
    from rpeg.runtime.mesh import Layout, build_mesh
    from rpeg.runtime.sharding import shard_roles

    lay = Layout(tp=tp)
    lm = model(model_type, **over)
    shards = shard_roles(lm, lm, lay, build_mesh(lay))
    logits, loss = loss_of(lm)
    loss.backward()
    shards.sync_grads()  # the tp sums of partial gradients (per-head norms)
    return {"logits": logits, "grads": full_grads(lm)}


def _body(rank: int, world: int, port: int, case: str, kw: dict, q) -> None:
    import torch.distributed as dist

    try:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        res = globals()[case](rank, **kw)
        buf = io.BytesIO()
        torch.save(res, buf)
        q.put((rank, buf.getvalue()))
        dist.destroy_process_group()
    except Exception:  # the parent reports it
        q.put((rank, traceback.format_exc()))


def spawn(world: int, case: str, port: int, timeout_s: float = 300.0, **kw) -> dict:
    """``case(rank, **kw)`` on ``world`` spawned gloo ranks -> ``{rank: result}``."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_body, args=(r, world, port, case, kw, q)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict = {}
    try:
        for _ in range(world):
            rank, res = q.get(timeout=timeout_s)
            if isinstance(res, str):
                raise AssertionError(f"rank {rank} failed:\n{res}")
            out[rank] = torch.load(io.BytesIO(res), weights_only=True)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def nll_of(lm, ids: torch.Tensor, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, ``share`` x the mean next-token NLL of ``ids``)."""
    logits = lm(input_ids=ids).logits
    logp = logits[:, :-1].log_softmax(-1)
    return logits.detach(), -logp.gather(-1, ids[:, 1:, None]).mean() * share


def ep_reference(model_type: str) -> dict:
    lm = model(model_type)
    logits, loss = nll_of(lm, IDS, 1.0)
    loss.backward()
    return {"logits": logits, "grads": full_grads(lm)}


def ep_case(rank: int, model_type: str) -> dict:
    """Rank ``r`` runs row ``r`` of IDS (half the batch: half the loss) with the experts split
    over the two ranks; the replicated parameters' gradients summed over them."""
    import torch.distributed as dist

    from rpeg.runtime.expert_parallel import apply_expert_parallel, sum_replicated_grads

    lm = model(model_type)
    group = dist.group.WORLD
    apply_expert_parallel(lm, group)
    logits, loss = nll_of(lm, IDS[rank : rank + 1], 1.0 / dist.get_world_size())
    loss.backward()
    sum_replicated_grads(lm, group)
    grads = {
        n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in lm.named_parameters()
    }
    return {"logits": logits, "grads": {n: g.detach().clone() for n, g in grads.items()}}
