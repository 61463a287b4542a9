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


def lora_policy(cfg, nonzero_b: bool = True):
    """sharding_cases' model with adapters (A seeded by name: rpeg.runtime.lora.adapter_init)
    whose B is nonzero when ``nonzero_b`` (seeded: the same on every rank and in the
    single-process reference), as a PolicyWorker."""
    from rpeg.config import LoraSection
    from rpeg.runtime.lora import apply_lora

    m, tok = C.model()
    m = apply_lora(m, LoraSection(**LORA), seed=cfg.runtime.seed)
    if nonzero_b:
        torch.manual_seed(5)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if ".lora_B." in n:
                    p.normal_(0, 0.05)
    return C.policy(cfg, m, tok)


def meta_lora_policy(cfg):
    """The same LoRA policy built as a rank of a sharded layout builds it: on the meta device
    (B zero, as a run starts), with the source of the base model's initial weights."""
    from rpeg.config import LoraSection
    from rpeg.runtime.lora import apply_lora

    m, tok, source = C.meta_model()
    m = apply_lora(m, LoraSection(**LORA), seed=cfg.runtime.seed)
    return C.policy(cfg, m, tok), source


def reference(nonzero_b: bool = True) -> tuple[dict, dict]:
    """One single-process step on the whole batch: metrics and the merged weights after."""
    w = lora_policy(C.config(), nonzero_b)
    metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
    return metrics, w.get_weights()


def _sharded(cfg, lay, mesh, meta: bool = False):
    from rpeg.runtime.parallel import process_group_reduce

    reduce = process_group_reduce(mesh.get_group("dp"))
    if not meta:
        w = lora_policy(cfg)
        w.apply_layout(lay, mesh, reduce)
        return w
    w, source = meta_lora_policy(cfg)
    w.apply_layout(lay, mesh, reduce, source=source, device=torch.device("cpu"))
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
        wm = _sharded(cfg, lay, mesh, meta=True)  # built on meta, filled shard by shard
        meta_metrics = wm.train_step(C.with_old_logprobs(C.batch(0).select(rows), wm))
        res = {
            "metrics": metrics,
            "merged": merged,
            "saved_keys": sorted(weights),
            "reloaded_equal": all(torch.equal(merged[k], merged2[k]) for k in merged),
            "meta_metrics": meta_metrics,
            "meta_merged": wm.get_weights(),
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
