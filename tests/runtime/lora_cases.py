"""What the LoRA + FSDP test runs on spawned ranks (gloo on the CPU, fp32): a LoRA policy of
sharding_cases' model sharded at FSDP dp=2, one train step, its merged weights and its
adapter-only checkpoint reloaded into a fresh sharded worker. Kept out of the test module so
that the spawned children import only this file (and sharding_cases)."""

from __future__ import annotations

import io
import traceback

import sharding_cases as C
import torch

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}


def lora_policy(cfg):
    """sharding_cases' model with adapters whose B is nonzero (seeded: the same on every
    rank and in the single-process reference), as a PolicyWorker."""
    from rpeg.config import LoraSection
    from rpeg.runtime.lora import apply_lora

    m, tok = C.model()
    torch.manual_seed(5)  # peft draws A from the global generator: the same on every rank
    m = apply_lora(m, LoraSection(**LORA))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.05)
    return C.policy(cfg, m, tok)


def reference() -> tuple[dict, dict]:
    """One single-process step on the whole batch: metrics and the merged weights after."""
    w = lora_policy(C.config())
    metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
    return metrics, w.get_weights()


def _sharded(cfg, lay, mesh):
    from rpeg.runtime.parallel import process_group_reduce

    w = lora_policy(cfg)
    w.apply_layout(lay, mesh, process_group_reduce(mesh.get_group("dp")))
    return w


def body(rank: int, world: int, port: int, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime.mesh import Layout, build_mesh
    from rpeg.runtime.role_state import load_role_state, role_state

    try:
        C._init(rank, world, port)
        cfg = C.config()
        lay = Layout(dp=2, tp=1, fsdp=True)
        mesh = build_mesh(lay)
        w = _sharded(cfg, lay, mesh)
        rows = C.rows_of(lay.dp_index(rank), lay.dp)
        metrics = w.train_step(C.with_old_logprobs(C.batch(0).select(rows), w))
        merged = w.get_weights()
        weights, optim = role_state(w.module, w.optimizer, w.shards)
        w2 = _sharded(cfg, lay, mesh)
        load_role_state(w2.module, w2.optimizer, {"module": weights, "optimizer": optim}, w2.shards)
        merged2 = w2.get_weights()
        res = {
            "metrics": metrics,
            "merged": merged,
            "saved_keys": sorted(weights),
            "reloaded_equal": all(torch.equal(merged[k], merged2[k]) for k in merged),
        }
        buf = io.BytesIO()
        torch.save(res, buf)
        q.put((rank, buf.getvalue()))
        dist.destroy_process_group()
    except Exception:  # the parent reports it
        q.put((rank, traceback.format_exc()))


def spawn(port: int, timeout_s: float = 300.0) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=body, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(2):
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
