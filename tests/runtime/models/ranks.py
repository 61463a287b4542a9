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


# --- the compiled step's path: PolicyWorker.apply_layout at ep > 1 -----------------------
def ep_policy(model_type: str, layout=None, *, meta: bool = False):
    """A tiny MoE PolicyWorker (sharding_cases' config), laid out at ``layout`` over the
    world group (None: one process, whole); ``meta``: built on the meta device and filled
    with this rank's shards only (rpeg.runtime.materialize)."""
    from rpeg.runtime.materialize import ModuleSource, meta_causal_lm
    from rpeg.runtime.mesh import build_mesh
    from rpeg.runtime.parallel import LOCAL, process_group_reduce
    from rpeg.runtime.tokenizer import build_char_tokenizer
    from tests.runtime import sharding_cases as SC

    lm, source = model(model_type, router_aux_loss_coef=0.0), None  # aux: per-rank, nonlinear
    if meta:
        lm, source = meta_causal_lm(lm.config, torch.float32), ModuleSource(lm)
    w = SC.policy(SC.config(), lm, build_char_tokenizer())
    if layout is not None:
        mesh = build_mesh(layout)
        reduce = process_group_reduce(mesh.get_group("dp")) if layout.dp > 1 else LOCAL
        w.apply_layout(layout, mesh, reduce, source=source, device=torch.device("cpu"))
    return w


def ep_step(w, rows, step: int = 0) -> dict:
    """One train step of ``w`` on ``rows`` of sharding_cases' batch ``step``: its metrics, the
    log-probs before it, the full weights after and the greedy decode of two prompts."""
    from rpeg.runtime.sharding import full_state_dict
    from tests.runtime import sharding_cases as SC

    b = SC.with_old_logprobs(SC.batch(step).select(rows), w)
    m = w.train_step(b)
    return {"metrics": m, "logprobs": b.old_logprobs, "weights": full_state_dict(w.module)}


EP_PROMPTS = ([[1, 5, 9, 14], [1, 22, 7]], [[1, 3, 3, 8, 40]])


def ep_reference_steps(model_type: str, steps: int = 1) -> tuple[list[dict], list]:
    """One process: ``steps`` train steps on the whole batch, then the greedy decodes."""
    from tests.runtime import sharding_cases as SC

    w = ep_policy(model_type)
    first = ep_step(w, list(range(8)), 0)
    tokens = [SC.greedy(w, EP_PROMPTS[r], cap=(6, 3)[r]) for r in (0, 1)]
    return [first] + [ep_step(w, list(range(8)), s) for s in range(1, steps)], tokens


def ep_layout_case(
    rank: int, model_type: str, layout: dict, resume: dict | None = None, url: str = ""
) -> dict:
    """Step 0 at ``layout`` (built on meta, filled with this rank's experts); with ``resume``:
    save the shards, a fresh worker at ``resume`` loads them and runs step 1."""
    from rpeg.runtime.actors import shard_checkpoint as SCK
    from rpeg.runtime.mesh import Layout
    from rpeg.runtime.sharding import param_bytes_full, param_bytes_local
    from tests.runtime import sharding_cases as SC

    lay = Layout(**layout)
    w = ep_policy(model_type, lay, meta=True)
    out = {"local": param_bytes_local(w.module), "full": param_bytes_full(w.module)}
    out["steps"] = [ep_step(w, SC.rows_of(lay.dp_index(rank), lay.dp))]
    # rank 0 decodes 2 rows for 6 tokens, rank 1 one row for 3: lockstep over the all-to-alls
    out["tokens"] = SC.greedy(w, EP_PROMPTS[rank], cap=(6, 3)[rank])
    if resume is not None:
        SCK.save_shards(url, SCK.worker_roles(actor=w), SCK.worker_extras(actor=w))
        del w
        lay2 = Layout(**resume)
        v = ep_policy(model_type, lay2, meta=True)
        ext = SCK.load_shards(url, SCK.worker_roles(actor=v), SCK.worker_extras(actor=v))
        SCK.restore_extras(ext, actor=v)
        out["steps"].append(ep_step(v, SC.rows_of(lay2.dp_index(rank), lay2.dp), 1))
    return out
