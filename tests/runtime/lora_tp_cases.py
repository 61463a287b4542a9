"""What the LoRA + tensor-parallel tests run on spawned ranks (gloo on the CPU, fp32): a
hand-worked two-layer toy split column-wise then row-wise, and a LoRA policy of
sharding_cases' model at tp=2 (and tp=2 x fsdp dp=2): logits, adapter gradients, one train
step, merged weights, adapter-only checkpoints. Kept out of the test module so that the
spawned children import only this file (and sharding_cases)."""

from __future__ import annotations

import io
import traceback

import sharding_cases as C
import torch

#: every Linear kind of a block: q/k/v/gate/up column-wise, o/down row-wise
LORA = {
    "rank": 4,
    "alpha": 8.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
IDS = [[1, 5, 9, 14, 2, 7, 3], [1, 22, 7, 3, 3, 8, 40]]


# --- the hand-worked toy ----------------------------------------------------------------------
class Toy(torch.nn.Module):
    """x -> q_proj (column-wise at tp) -> o_proj (row-wise), both 4 x 4, no bias."""

    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(4, 4, bias=False)
        self.o_proj = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.o_proj(self.q_proj(x))


def toy():
    """W = I for both; rank 1, alpha 2 (scale 2); A_q = [1, 0, 0, 0], B_q = [1, 0, 0, 1]^T,
    A_o = [1, 0, 0, 1], B_o = [0, 0, 0, 1]^T (test_lora_tp.py works the values out)."""
    from peft import LoraConfig, inject_adapter_in_model

    m = Toy()
    cfg = LoraConfig(r=1, lora_alpha=2, target_modules=["q_proj", "o_proj"], lora_dropout=0.0)
    m = inject_adapter_in_model(cfg, m)
    with torch.no_grad():
        for lin in (m.q_proj.base_layer, m.o_proj.base_layer):
            lin.weight.copy_(torch.eye(4))
        m.q_proj.lora_A["default"].weight.copy_(torch.tensor([[1.0, 0, 0, 0]]))
        m.q_proj.lora_B["default"].weight.copy_(torch.tensor([[1.0], [0], [0], [1]]))
        m.o_proj.lora_A["default"].weight.copy_(torch.tensor([[1.0, 0, 0, 1]]))
        m.o_proj.lora_B["default"].weight.copy_(torch.tensor([[0.0], [0], [0], [1]]))
    return m


def toy_run(m, split: bool = False) -> dict:
    """Output without and with autograd; sum(output) backward: x's and the adapters' gradients
    (full tensors); ``split``: also the rank's own share of the replicated factors' gradients
    before the sum over tp (rpeg.runtime.tensor_parallel.sum_partial_grads)."""
    from torch.distributed.tensor import DTensor

    from rpeg.runtime.tensor_parallel import sum_partial_grads

    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    with torch.no_grad():
        y0 = m(x)
    y = m(x)
    y.sum().backward()

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    partial = {}
    if split:
        partial = {n: p.grad.to_local().clone() for n, p in m.named_parameters() if ".lora_" in n}
        sum_partial_grads(m)
    return {
        "y_nograd": y0,
        "y": y.detach(),
        "x_grad": x.grad,
        "partial": partial,
        "grads": {n: full(p.grad) for n, p in m.named_parameters() if ".lora_" in n},
        "placements": {
            n: str(p.placements) for n, p in m.named_parameters() if isinstance(p, DTensor)
        },
    }


def toy_case(mesh) -> dict:
    from rpeg.runtime.lora_tp import shard_lora_linear

    m = toy()
    shard_lora_linear(m.q_proj, "colwise", mesh["tp"])
    shard_lora_linear(m.o_proj, "rowwise", mesh["tp"])
    return toy_run(m, split=True)


# --- a LoRA policy ----------------------------------------------------------------------------
def lora_policy(cfg, lora=None):
    """sharding_cases' model with adapters on every Linear kind, B nonzero (seeded: the same
    on every rank and in the single-process reference), as a PolicyWorker."""
    from rpeg.config import LoraSection
    from rpeg.runtime.lora import apply_lora

    m, tok = C.model()
    torch.manual_seed(5)  # peft draws A from the global generator: the same on every rank
    m = apply_lora(m, LoraSection(**(lora or LORA)))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.05)
    return C.policy(cfg, m, tok)


def adapter_grads(w) -> tuple[torch.Tensor, dict]:
    """Logits of :data:`IDS` and, after one backward of a log-likelihood loss over them and the
    gradient sync the trainer runs before its norm (tp sums, dp average), the adapters'
    gradients (full tensors); the gradients are cleared afterwards."""
    from torch.distributed.tensor import DTensor

    ids = torch.tensor(IDS)
    logits = w.lm(input_ids=ids).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    loss = -lp.mean()
    loss.backward()
    if w.shards is not None:
        w.shards.sync_grads()
    grads = {}
    for n, p in w.lm.named_parameters():
        if p.grad is not None:
            g = p.grad
            grads[n] = (g.full_tensor() if isinstance(g, DTensor) else g).clone()
            p.grad = None
    return logits.detach(), loss.detach(), grads


def reference() -> dict:
    """One process: logits, loss and adapter gradients, log-probs and greedy tokens (no
    autograd), then one train step's metrics and the merged weights after."""
    w = lora_policy(C.config())
    logits, loss, grads = adapter_grads(w)
    logprobs, tokens = w.compute_logprobs(C.batch(0)), C.greedy(w, C.PROMPTS)
    metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
    return {
        "logits": logits,
        "loss": loss,
        "grads": grads,
        "logprobs": logprobs,
        "tokens": tokens,
        "metrics": metrics,
        "merged": w.get_weights(),
    }


def sharded(cfg, lay, mesh, lora=None):
    from rpeg.runtime.parallel import LOCAL, process_group_reduce

    w = lora_policy(cfg, lora)
    reduce = process_group_reduce(mesh.get_group("dp")) if lay.dp > 1 else LOCAL
    w.apply_layout(lay, mesh, reduce)
    return w


def policy_case(lay, mesh, rank: int, url: str | None) -> dict:
    """At ``lay``: logits, loss and adapter gradients, log-probs of this rank's rows and (dp 1)
    greedy tokens, one train step on this rank's rows, the merged weights, the rank state (adapters only) and -- with ``url`` -- DCP shards."""
    from torch.distributed.tensor import DTensor

    from rpeg.runtime.actors.shard_checkpoint import save_shards, worker_extras, worker_roles
    from rpeg.runtime.role_state import role_state

    cfg = C.config()
    w = sharded(cfg, lay, mesh)
    logits, loss, grads = adapter_grads(w)
    rows = C.rows_of(lay.dp_index(rank), lay.dp)
    logprobs = w.compute_logprobs(C.batch(0).select(rows))  # no autograd: the decode path
    tokens = C.greedy(w, C.PROMPTS) if lay.dp == 1 else None
    metrics = w.train_step(C.with_old_logprobs(C.batch(0).select(rows), w))
    merged = w.get_weights()
    weights, optim = role_state(w.module, w.optimizer, w.shards)
    if url:
        save_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    a = w.lm.get_submodule("model.layers.0.self_attn")
    return {
        "logits": logits,
        "loss": loss,
        "grads": grads,
        "logprobs": logprobs,
        "rows": rows,
        "tokens": tokens,
        "metrics": metrics,
        "merged": merged,
        "weights": weights,
        "optim_keys": sorted(optim.get("state", {})),  # rank 0 holds the gathered state
        "classes": [type(a.q_proj).__name__, type(a.o_proj).__name__],
        "placements": {
            n: str(p.placements)
            for n, p in a.named_parameters()
            if isinstance(p, DTensor) and ".lora_" in n
        },
    }


def dropout_case(lay, mesh, rank: int) -> dict:
    """Dropout 0.5 at ``lay``, each rank's generator seeded apart (its own masks): one train
    step; the replicated factors' local weights after it and the step's loss terms."""
    from torch.distributed.tensor import DTensor

    w = sharded(C.config(), lay, mesh, {**LORA, "dropout": 0.5})
    b = C.with_old_logprobs(C.batch(0), w)
    torch.manual_seed(100 + rank)
    metrics = w.train_step(b)
    return {
        "metrics": metrics,
        "replicated": {
            n: p.to_local().detach().clone()
            for n, p in w.lm.named_parameters()
            if ".lora_" in n and isinstance(p, DTensor) and p.placements[0].is_replicate()
        },
    }


def one_process_checkpoint(url: str) -> dict:
    """One process (no process group): one train step, its DCP shards saved to ``url``, then
    a second step; the merged weights after each (what a resumed tp=2 worker must match)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from rpeg.runtime.actors.shard_checkpoint import save_shards, worker_extras, worker_roles

    w = lora_policy(C.config())
    w.train_step(C.with_old_logprobs(C.batch(0), w))
    save_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    merged1 = w.get_weights()
    moments = _moments(get_state_dict(w.module, w.optimizer)[1])
    metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
    return {"merged1": merged1, "moments": moments, "merged2": w.get_weights(), "metrics": metrics}


def _moments(osd: dict) -> dict:
    """AdamW's two moments of every parameter of an FQN-keyed optimizer state (cloned)."""
    return {
        k: (v["exp_avg"].clone(), v["exp_avg_sq"].clone()) for k, v in osd.get("state", {}).items()
    }


def resume_case(lay, mesh, url: str) -> dict:
    """At ``lay``: load :func:`one_process_checkpoint`'s shards (tp1 -> this layout), the
    merged weights, then one more train step (the loaded AdamW moments at work)."""
    from rpeg.runtime.actors.shard_checkpoint import (
        load_shards,
        restore_extras,
        worker_extras,
        worker_roles,
    )
    from rpeg.runtime.role_state import role_state

    w = sharded(C.config(), lay, mesh)
    extras = load_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    restore_extras(extras, actor=w)
    version = w.policy_version
    merged1 = w.get_weights()
    moments = _moments(role_state(w.module, w.optimizer, w.shards)[1])  # gathered on rank 0
    metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
    return {
        "merged1": merged1,
        "moments": moments,
        "merged2": w.get_weights(),
        "metrics": metrics,
        "version": version,
    }


# --- spawned bodies ---------------------------------------------------------------------------
def body(rank: int, world: int, port: int, cases: list, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime.mesh import Layout, build_mesh

    try:
        C._init(rank, world, port)
        for name, kind, kw in cases:
            lay = Layout(**kw["layout"])
            mesh = build_mesh(lay)
            if kind == "toy":
                res = toy_case(mesh)
            elif kind == "dropout":
                res = dropout_case(lay, mesh, rank)
            elif kind == "resume":
                res = resume_case(lay, mesh, kw["url"])
            else:
                res = policy_case(lay, mesh, rank, kw.get("url"))
            buf = io.BytesIO()
            torch.save(res, buf)
            q.put((name, rank, buf.getvalue()))
        dist.destroy_process_group()
    except Exception:  # the parent reports it
        q.put(("error", rank, traceback.format_exc()))


def spawn(world: int, cases: list, port: int, timeout_s: float = 300.0) -> dict:
    """Run ``cases`` on ``world`` spawned ranks -> ``{name: {rank: result}}``."""
    return C.run_spawned(body, world, cases, port, timeout_s)
