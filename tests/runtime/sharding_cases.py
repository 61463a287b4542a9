"""What the sharding tests run: a fixed synthetic batch, the single-process reference, and the
per-rank bodies started with ``torch.multiprocessing`` (spawn; gloo on the CPU, fp32).

Kept out of the test module so that the spawned children import only this file.
"""

from __future__ import annotations

import io
import os
import traceback

import torch

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA: 2 q heads per kv head on every tp rank
}
GROUP = 2  # samples per prompt
ROWS = 8


def config(**over):
    from rpeg.config import RunConfig

    base = {
        "algorithm.name": "grpo",
        "algorithm.kl_coef": 0.1,
        "algorithm.entropy_coef": 0.01,
        "workload.num_prompts": ROWS // GROUP,
        "workload.samples_per_prompt": GROUP,
        "workload.micro_batch_size": 2,
        "workload.train_minibatches": 1,
        "optim.lr": 1e-3,
    }
    base.update(over)
    return RunConfig().with_overrides(base)


def model():
    from rpeg.runtime.model_io import create_tiny

    return create_tiny(seed=0, **SHAPE)


def batch(seed: int = 0):
    """A rollout batch with hand-made lengths (prompts 3..6, responses 2..7 tokens),
    random tokens, advantages and reference log-probs; ``old_logprobs`` are set by
    :func:`with_old_logprobs` from the model."""
    from rpeg.runtime.batch import RolloutBatch
    from rpeg.runtime.engines.torch_engine import left_pad

    g = torch.Generator().manual_seed(seed)
    p_len = [3, 5, 4, 6, 3, 4, 6, 5]
    r_len = [2, 7, 5, 3, 6, 4, 2, 7]
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in p_len]
    p_ids, p_mask = left_pad(prompts, 0)
    r = max(r_len)
    resp = torch.randint(3, 100, (ROWS, r), generator=g)
    mask = (torch.arange(r)[None, :] < torch.tensor(r_len)[:, None]).long()
    resp = resp * mask
    adv = torch.randn(ROWS, r, generator=g) * mask
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=resp,
        response_mask=mask,
        sample_logprobs=torch.zeros(ROWS, r),
        policy_version=torch.zeros(ROWS, dtype=torch.long),
        group_ids=torch.arange(ROWS // GROUP).repeat_interleave(GROUP),
        advantages=adv,
        ref_logprobs=-4.0 + 0.1 * torch.randn(ROWS, r, generator=g) * mask,
        values=0.1 * torch.randn(ROWS, r, generator=g) * mask,
        returns=torch.randn(ROWS, r, generator=g) * mask,
    )


def with_old_logprobs(b, worker):
    lp = worker.compute_logprobs(b)
    return b.replace(old_logprobs=lp, sample_logprobs=lp)


def compute_dtype(cfg) -> torch.dtype:
    """The compute dtype of ``cfg.workload.precision`` on the CPU (rpeg.runtime.precision)."""
    from rpeg.compile.layouts import compute_dtype_name
    from rpeg.runtime.model_io import torch_dtype

    return torch_dtype(compute_dtype_name(cfg.workload.precision, "cpu"))


def policy(cfg, m, tok, **kw):
    from rpeg.runtime.roles import PolicyWorker

    a = cfg.algorithm
    kw.setdefault("compute_dtype", compute_dtype(cfg))
    return PolicyWorker(
        m,
        tok,
        algorithm=a,
        optim=cfg.optim,
        workload=cfg.workload,
        value_head=a.name == "ppo" and a.share_actor_critic,
        seed=cfg.runtime.seed,
        **kw,
    )


def rows_of(dp_index: int, dp: int) -> list[int]:
    """Whole prompt groups, contiguous, for data-parallel index ``dp_index``."""
    per = ROWS // dp
    return list(range(dp_index * per, (dp_index + 1) * per))


def critic(cfg, m):
    from rpeg.runtime.critic import CriticWorker

    return CriticWorker(
        m,
        algorithm=cfg.algorithm,
        optim=cfg.optim,
        workload=cfg.workload,
        seed=cfg.runtime.seed,
        compute_dtype=compute_dtype(cfg),
    )


def reference_first_step(cfg, role: str = "actor") -> tuple[dict, dict]:
    """Single-process metrics of one train step on :func:`batch` and the weights after."""
    m, tok = model()
    if role == "critic":
        w = critic(cfg, m)
        return w.train_step(batch(0)), {k: v.clone() for k, v in w.module.state_dict().items()}
    w = policy(cfg, m, tok)
    metrics = w.train_step(with_old_logprobs(batch(0), w))
    return metrics, {k: v.clone() for k, v in w.module.state_dict().items()}


def reference(cfg, steps: int = 1) -> list[dict]:
    """Single-process metrics of ``steps`` train steps on :func:`batch` (seed = step)."""
    m, tok = model()
    w = policy(cfg, m, tok)
    out = []
    for s in range(steps):
        b = with_old_logprobs(batch(s), w)
        out.append(w.train_step(b))
    return out


# --- spawned bodies -------------------------------------------------------------------------
def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def meta_model():
    """(the test model on the meta device, its tokenizer, a source of its initial weights):
    how a rank of a sharded layout builds it (rpeg.runtime.materialize)."""
    from rpeg.runtime.materialize import ModuleSource, meta_causal_lm

    m, tok = model()
    return meta_causal_lm(m.config, torch.float32), tok, ModuleSource(m)


def sharded_policy(cfg, layout, mesh, meta: bool = False):
    """The test policy laid out at ``layout``; ``meta``: built on the meta device and filled
    with this rank's shards (sharded construction), else built whole and then sharded."""
    from rpeg.runtime.parallel import LOCAL, process_group_reduce

    m, tok, source = meta_model() if meta else (*model(), None)
    w = policy(cfg, m, tok)
    reduce = process_group_reduce(mesh.get_group("dp")) if layout.dp > 1 else LOCAL
    w.apply_layout(layout, mesh, reduce, source=source, device=torch.device("cpu"))
    return w


def train_case(cfg, layout, mesh, rank: int, role: str = "actor", meta: bool = False) -> dict:
    """First step at ``layout``: metrics of this rank's shard and the full weights after
    (of the whole role module: LM and value head)."""
    from rpeg.runtime.parallel import LOCAL, process_group_reduce
    from rpeg.runtime.sharding import full_state_dict, param_bytes_full, param_bytes_local

    rows = rows_of(layout.dp_index(rank), layout.dp)
    if role == "critic":
        m, _, source = meta_model() if meta else (*model(), None)
        w = critic(cfg, m)
        reduce = process_group_reduce(mesh.get_group("dp")) if layout.dp > 1 else LOCAL
        w.apply_layout(layout, mesh, reduce, source=source, device=torch.device("cpu"))
        b = batch(0).select(rows)
    else:
        w = sharded_policy(cfg, layout, mesh, meta)
        b = with_old_logprobs(batch(0).select(rows), w)
    full = param_bytes_full(w.module)
    local = param_bytes_local(w.module)
    gathers = _count_all_gathers()
    m = w.train_step(b)
    all_gathers = gathers.stop()
    weights = full_state_dict(w.module)
    from torch.distributed.fsdp import FSDPModule

    fsdp = [x for x in w.module.modules() if isinstance(x, FSDPModule)]
    units = len({id(x._get_fsdp_state()) for x in fsdp})
    policies = {str(x._get_fsdp_state()._mp_policy) for x in fsdp}
    return {
        "param_dtypes": sorted({str(p.dtype) for p in w.module.parameters()}),
        "optim_dtypes": sorted(
            {str(v.dtype) for st in w.optimizer.state.values() for v in st.values() if v.dim()}
        ),
        "mp_policies": sorted(policies),
        "metrics": m,
        "weights": weights,
        "local": local,
        "full": full,
        "local_after": param_bytes_local(w.module),  # every FSDP unit resharded after the step
        "fsdp_units": units,
        "split_update": w.shards is not None and w.shards.split is not None,  # pair_update
        "weights_digest": _digest(weights),  # (rank > 0 sends no weights)
        "layers": w.module.config.num_hidden_layers if role != "critic" else 0,
        "all_gathers": all_gathers,  # FSDP unit all-gathers during the training step
    }


def _digest(weights: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode() + weights[k].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _count_all_gathers:
    """Counts FSDP's parameter all-gathers (its pair-channel all-gather: a 2-rank dp group on
    this host) until :meth:`stop`."""

    def __init__(self):
        from rpeg.runtime.pair_channel import PairAllGather

        self.n = 0
        self._orig = PairAllGather.__call__

        def counted(this, *a, **kw):
            self.n += 1
            return self._orig(this, *a, **kw)

        PairAllGather.__call__ = counted

    def stop(self) -> int:
        from rpeg.runtime.pair_channel import PairAllGather

        PairAllGather.__call__ = self._orig
        return self.n


def resume_case(cfg, saved, resumed, mesh_a, mesh_b, rank: int, url: str) -> dict:
    """Step 1 at layout ``saved``, checkpoint, a fresh worker at layout ``resumed`` loads it
    and runs step 2: its metrics."""
    from rpeg.runtime.actors.shard_checkpoint import (
        load_shards,
        restore_extras,
        save_shards,
        worker_extras,
        worker_roles,
    )

    w = sharded_policy(cfg, saved, mesh_a)
    b = with_old_logprobs(batch(0).select(rows_of(saved.dp_index(rank), saved.dp)), w)
    w.train_step(b)
    save_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    del w
    v = sharded_policy(cfg, resumed, mesh_b)
    extras = load_shards(url, worker_roles(actor=v), worker_extras(actor=v))
    restore_extras(extras, actor=v)
    b2 = with_old_logprobs(batch(1).select(rows_of(resumed.dp_index(rank), resumed.dp)), v)
    return {"metrics": v.train_step(b2), "version": v.policy_version}


PROMPTS = [[1, 5, 9, 14], [1, 22, 7], [1, 3, 3, 8, 40], [1, 61]]


def family_model(model_type: str):
    """A 2-layer random model of ``model_type`` (qwen2: q/k/v biases; qwen3: q/k norms)."""
    from transformers import AutoConfig

    from rpeg.runtime.model_io import create_model

    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=100,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        **SHAPE,
    )
    return create_model(cfg, seed=0)


def family_logits(model_type: str, m=None):
    m = m if m is not None else family_model(model_type)
    ids = torch.tensor([[1, 5, 9, 14, 2, 7], [1, 22, 7, 3, 3, 8]])
    with torch.no_grad():
        return m(input_ids=ids).logits


def forward_case(model_type: str, layout, mesh) -> dict:
    from rpeg.runtime.sharding import shard_roles

    m = family_model(model_type)
    shard_roles(m, m, layout, mesh)
    return {"logits": family_logits(model_type, m)}


def greedy(worker, prompts, cap: int = 6):
    from rpeg.runtime.engines.base import SamplingParams

    out = worker.generate(prompts, SamplingParams(max_new_tokens=cap, temperature=0.0), seed=0)
    return [row[: int(n)].tolist() for row, n in zip(out.response_ids, out.lengths, strict=True)]


def generate_case(cfg, layout, mesh, gen_layout, gen_mesh, rank: int, caps=None) -> dict:
    """Greedy decode of this rank's generation dp index's prompts at ``gen_layout`` (on the
    training shards when it equals ``layout``, else on the engine's own copy); ``caps``:
    new tokens per rank (default 6)."""
    from rpeg.runtime.parallel import LOCAL, process_group_reduce

    m, tok = model()
    w = policy(cfg, m, tok)
    reduce = process_group_reduce(mesh.get_group("dp")) if layout.dp > 1 else LOCAL
    w.apply_layout(layout, mesh, reduce, gen_layout, gen_mesh)
    per = len(PROMPTS) // gen_layout.dp
    d = gen_layout.dp_index(rank)
    mine = PROMPTS[d * per : (d + 1) * per]
    if gen_layout.tp == 1 and rank == 0:  # dp ranks: rank 0 decodes one row more
        mine = mine + [[1, 2]]
    cap = (caps or {}).get(rank, 6)
    return {"tokens": greedy(w, mine, cap), "rows": mine, "shared": w.engine.model is w.lm}


def body(rank: int, world: int, port: int, cases: list, q) -> None:
    """Run ``cases`` (``(name, kind, kwargs)``) in order on this rank; results to ``q``."""
    import torch.distributed as dist

    from rpeg.runtime.sharding import Layout, build_mesh

    try:
        _init(rank, world, port)
        import rpeg.runtime.sharding as sharding

        default_unit = sharding.FSDP_UNIT_BYTES
        for name, kind, kw in cases:
            cfg = config(**kw.get("over", {}))
            # 1 byte: one FSDP unit per decoder block (what models past FSDP_UNIT_BYTES get)
            sharding.FSDP_UNIT_BYTES = kw.get("fsdp_unit_bytes", default_unit)
            if kind == "train":
                lay = Layout(**kw["layout"])
                role = kw.get("role", "actor")
                res = train_case(cfg, lay, build_mesh(lay), rank, role, kw.get("meta", False))
            elif kind == "forward":
                lay = Layout(**kw["layout"])
                res = forward_case(kw["model_type"], lay, build_mesh(lay))
            elif kind == "tensor_parallel":
                from tp_mlp_cases import tensor_parallel_case

                res = tensor_parallel_case(build_mesh(Layout(**kw["layout"])), rank)
            elif kind == "generate":
                lay = Layout(**kw["layout"])
                gen = Layout(**kw.get("gen", kw["layout"]))
                mesh = build_mesh(lay)
                gen_mesh = mesh if gen == lay else build_mesh(gen)
                res = generate_case(cfg, lay, mesh, gen, gen_mesh, rank, kw.get("caps"))
            else:
                a, b = Layout(**kw["saved"]), Layout(**kw["resumed"])
                res = resume_case(cfg, a, b, build_mesh(a), build_mesh(b), rank, kw["url"])
            if rank != 0:
                res.pop("weights", None)
            buf = io.BytesIO()
            torch.save(res, buf)  # bytes: shared-memory tensors die with this process
            q.put((name, rank, buf.getvalue()))
        dist.destroy_process_group()
    except Exception:  # the parent reports it
        q.put(("error", rank, traceback.format_exc()))


def spawn(world: int, cases: list, port: int, timeout_s: float = 300.0) -> dict:
    """Run ``cases`` on ``world`` spawned ranks -> ``{name: {rank: result}}``."""
    return run_spawned(body, world, cases, port, timeout_s)


def run_spawned(target, world: int, cases: list, port: int, timeout_s: float = 300.0) -> dict:
    """``target(rank, world, port, cases, q)`` (a module-level function of a cases module, so
    a spawned child can import it) on ``world`` spawned ranks; each puts ``(name, rank,
    torch.save bytes)`` or ``("error", rank, traceback)`` -> ``{name: {rank: result}}``."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, cases, q)) for r in range(world)]
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
