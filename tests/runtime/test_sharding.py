"""Sharded training equals the single-process trainer (fp32, gloo, spawned ranks).

The reference is :class:`rpeg.runtime.roles.PolicyWorker` in this process on the whole batch.
A layout's ranks each get their data-parallel index's rows (whole prompt groups; the tp ranks
of one index share them). A rank's loss metrics are its share of the global mini-batch loss
(weighted by its tokens), so their mean over the dp indices is the global loss; the gradient
norm is global on every rank.
"""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch

TOL = 1e-5
LOSSES = ("pg_loss", "kl", "entropy")
PPO = {"algorithm.name": "ppo", "algorithm.share_actor_critic": True}
LAYOUTS_2 = {
    "fsdp_dp2": {"dp": 2, "tp": 1, "fsdp": True},
    "tp2": {"dp": 1, "tp": 2},
    "dp2_replicas": {"dp": 2, "tp": 1, "fsdp": False},
}


def _loss(per_rank: dict, dp: int, tp: int, key: str) -> float:
    return sum(per_rank[d * tp]["metrics"][key] for d in range(dp)) / dp


def _check(ref: dict, ref_weights: dict, res: dict, dp: int, tp: int, keys=LOSSES) -> None:
    for key in keys:
        assert _loss(res, dp, tp, key) == pytest.approx(ref[key], abs=TOL), key
    norm = "critic_grad_norm" if "critic_grad_norm" in ref else "grad_norm"
    for r, out in res.items():
        assert out["metrics"][norm] == pytest.approx(ref[norm], abs=TOL), r
    w = res[0]["weights"]
    assert set(w) == set(ref_weights)
    for k, v in ref_weights.items():
        torch.testing.assert_close(w[k], v, atol=TOL, rtol=0, msg=k)


@pytest.fixture(scope="module")
def reference():
    return C.reference_first_step(C.config())


def test_layout_problems_name_what_tp_does_not_divide():
    from rpeg.errors import ConfigError
    from rpeg.runtime.mesh import Layout, layout_problems

    cfg = C.model()[0].config  # 4 heads, 2 kv heads, MLP 128
    assert layout_problems(cfg, 2) == []
    msgs = [p.what for p in layout_problems(cfg, 4)]
    assert msgs == ["tp=4 does not divide the model's num_key_value_heads=2"]
    assert len(layout_problems(cfg, 3)) == 3
    from rpeg.compile import GroupSpec

    g = GroupSpec("g", (0, 1, 2, 3), 4, ("actor",), ("actor",), (), dp=2, tp=2, fsdp=True)
    lay = Layout.from_group(g)
    assert (lay.dp, lay.tp, lay.dp_index(3), lay.tp_index(3)) == (2, 2, 1, 1)
    assert (lay.fsdp, lay.device_type, lay.dtype) == (True, "cpu", "float32")
    with pytest.raises(ConfigError, match="dp=3 x pp=1 x cp=1 x tp=2 = 6 ranks but world_size=4"):
        Layout.from_group(GroupSpec("g", (0, 1, 2, 3), 4, ("actor",), (), (), dp=3, tp=2))
    # rank order: tp innermost, then cp, then pp, dp outermost (16 ranks: dp2 x pp2 x cp2 x tp2)
    g16 = GroupSpec("g", tuple(range(16)), 16, ("actor",), (), (), dp=2, tp=2, pp=2, cp=2)
    lay = Layout.from_group(g16)
    idx = [(lay.dp_index(r), lay.pp_index(r), lay.cp_index(r), lay.tp_index(r)) for r in range(16)]
    assert idx == [
        (d, p, c, t) for d in range(2) for p in range(2) for c in range(2) for t in range(2)
    ]
    assert lay.replica_ranks == g16.replica_ranks == 8


@pytest.mark.slow  # > 10 s on 2 cores (docs/architecture.md "Tests")
def test_two_rank_layouts_equal_single_process(reference):
    ref, ref_w = reference
    fsdp = LAYOUTS_2["fsdp_dp2"]
    cases = [(n, "train", {"layout": lay}) for n, lay in LAYOUTS_2.items()]
    # the test model is one FSDP unit at the default size; 1 byte: one unit per block; just
    # over one block's bytes: units of two blocks (fully_shard of a list)
    block = sum(p.numel() * p.element_size() for p in C.model()[0].model.layers[0].parameters())
    units = {"fsdp_per_block": 1, "fsdp_two_blocks": block + 1}
    for name, size in units.items():
        cases.append((name, "train", {"layout": fsdp, "fsdp_unit_bytes": size}))
    # the same units kept gathered from forward to backward (reshard_after_forward false)
    gathered = {**fsdp, "reshard_after_forward": False}
    cases.append(("fsdp_gathered", "train", {"layout": gathered, "fsdp_unit_bytes": 1}))
    out = C.spawn(2, cases, port=29611)
    for name, lay in [*LAYOUTS_2.items(), *((n, fsdp) for n in [*units, "fsdp_gathered"])]:
        _check(ref, ref_w, out[name], lay["dp"], lay["tp"])
    # what a rank holds: fsdp dp=2 about half, tp=2 the blocks halved (embeddings replicated)
    full = out["fsdp_dp2"][0]["full"]
    for name in ("fsdp_dp2", *units):
        assert out[name][0]["local"] <= 0.55 * full, name
        assert out[name][0]["local_after"] == out[name][0]["local"], name  # resharded
    layers = out["fsdp_per_block"][0]["layers"]
    assert layers == 2
    assert out["fsdp_dp2"][0]["fsdp_units"] == 1  # the root only
    assert out["fsdp_per_block"][0]["fsdp_units"] == layers + 1
    assert out["fsdp_two_blocks"][0]["fsdp_units"] == 2  # both blocks, then the root
    # each unit gathered in forward and again in backward, for each of the rank's
    # micro-batches (4 rows, micro_batch_size 2); kept gathered: once per micro-batch
    units_n, micro = layers + 1, C.ROWS // 2 // 2
    assert out["fsdp_per_block"][0]["all_gathers"] == 2 * units_n * micro
    assert out["fsdp_gathered"][0]["all_gathers"] == units_n * micro
    assert out["fsdp_gathered"][0]["local_after"] == out["fsdp_gathered"][0]["local"]
    assert out["tp2"][0]["local"] < 0.75 * full
    assert out["dp2_replicas"][0]["local"] == full
    # the replicas split their update in halves (rpeg.runtime.pair_update) and end equal
    assert [out[n][0]["split_update"] for n in LAYOUTS_2] == [False, False, True]
    assert out["dp2_replicas"][1]["weights_digest"] == out["dp2_replicas"][0]["weights_digest"]


@pytest.mark.slow
def test_value_heads_sharded_equal_single_process():
    """PPO: the actor-critic's value head (its own FSDP unit beside the LM) and a separate
    critic (trunk split by tp, value head replicated) at fsdp dp=2 and tp=2."""
    shared = C.reference_first_step(C.config(**PPO))
    crit = C.reference_first_step(C.config(**{"algorithm.name": "ppo"}), role="critic")
    cases = [
        ("shared_fsdp", "train", {"layout": {"dp": 2, "fsdp": True}, "over": PPO}),
        ("shared_tp2", "train", {"layout": {"tp": 2}, "over": PPO}),
        (
            "critic_fsdp",
            "train",
            {
                "layout": {"dp": 2, "fsdp": True},
                "role": "critic",
                "over": {"algorithm.name": "ppo"},
            },
        ),
        (
            "critic_tp2",
            "train",
            {"layout": {"tp": 2}, "role": "critic", "over": {"algorithm.name": "ppo"}},
        ),
    ]
    out = C.spawn(2, cases, port=29671)
    _check(*shared, out["shared_fsdp"], 2, 1, keys=(*LOSSES, "value_loss"))
    _check(*shared, out["shared_tp2"], 1, 2, keys=(*LOSSES, "value_loss"))
    _check(*crit, out["critic_fsdp"], 2, 1, keys=("value_loss",))
    _check(*crit, out["critic_tp2"], 1, 2, keys=("value_loss",))


@pytest.mark.slow
def test_qwen_blocks_split_by_tp_give_the_same_logits():
    """Qwen2 (q/k/v biases, split with their columns) and Qwen3 (per-head q/k RMSNorm, which
    stays whole) at tp=2, with GQA (4 query heads, 2 kv heads: 2 and 1 per rank)."""
    kinds = ("qwen2", "qwen3")
    cases = [(k, "forward", {"layout": {"tp": 2}, "model_type": k}) for k in kinds]
    out = C.spawn(2, cases, port=29711)
    for k in kinds:
        ref = C.family_logits(k)
        for r in (0, 1):
            torch.testing.assert_close(out[k][r]["logits"], ref, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_tp2_x_fsdp_dp2_equals_single_process(reference):
    ref, ref_w = reference
    cases = [
        ("tp2xdp2", "train", {"layout": {"dp": 2, "tp": 2, "fsdp": True}}),
        ("tp2xdp2_replicas", "train", {"layout": {"dp": 2, "tp": 2}}),
    ]
    out = C.spawn(4, cases, port=29631)
    _check(ref, ref_w, out["tp2xdp2"], 2, 2)
    _check(ref, ref_w, out["tp2xdp2_replicas"], 2, 2)
    for r in range(4):
        assert out["tp2xdp2"][r]["local"] <= 0.55 * out["tp2xdp2"][r]["full"]


@pytest.mark.slow
def test_checkpoint_saved_at_fsdp_dp2_resumes_at_tp2(tmp_path):
    ref = C.reference(C.config(), steps=2)
    case = {
        "saved": {"dp": 2, "tp": 1, "fsdp": True},
        "resumed": {"dp": 1, "tp": 2},
        "url": str(tmp_path / "ckpt"),
    }
    out = C.spawn(2, [("resume", "resume", case)], port=29651)["resume"]
    for r in (0, 1):  # tp=2: one dp index, both ranks hold the whole loss
        m = out[r]["metrics"]
        assert out[r]["version"] == 2
        for key in ("pg_loss", "grad_norm", "kl"):
            assert m[key] == pytest.approx(ref[1][key], abs=TOL), key
    assert (tmp_path / "ckpt" / ".metadata").exists()
    assert not (tmp_path / "ckpt.tmp").exists()


@pytest.mark.slow
def test_generation_on_shards_equals_single_process():
    """Greedy decode on tp=2 shards, on fsdp dp=2 shards (ranks with different prompts and
    row counts), on fsdp dp=2 shards whose ranks decode 6 and 3 tokens -- gathered per
    forward (the ranks decode in lockstep until both are done) and kept gathered for the
    loop (reshard_after_forward false: no collective after the first forward, the rank done
    first just stops) -- and on an engine copy at tp=2 beside fsdp dp=2 training."""
    m, tok = C.model()
    single = C.policy(C.config(), m, tok)
    cases = [
        ("tp2", "generate", {"layout": {"tp": 2}}),
        ("fsdp", "generate", {"layout": {"dp": 2, "fsdp": True}}),
        ("fsdp_gen_tp2", "generate", {"layout": {"dp": 2, "fsdp": True}, "gen": {"tp": 2}}),
        ("fsdp_uneven", "generate", {"layout": {"dp": 2, "fsdp": True}, "caps": {1: 3}}),
        # kept gathered (reshard_after_forward false): one gather, each rank its own loop
        (
            "fsdp_kept_uneven",
            "generate",
            {"layout": {"dp": 2, "fsdp": True, "reshard_after_forward": False}, "caps": {1: 3}},
        ),
    ]
    out = C.spawn(2, cases, port=29691)
    for name in ("fsdp_uneven", "fsdp_kept_uneven"):  # per-forward gathers: in lockstep
        uneven = out.pop(name)
        for r, cap in ((0, 6), (1, 3)):
            rows = uneven[r]["rows"]
            assert uneven[r]["tokens"] == C.greedy(single, rows, cap), (name, r)
            assert max(len(t) for t in uneven[r]["tokens"]) == cap
    for name in ("tp2", "fsdp", "fsdp_gen_tp2"):
        for r, res in out[name].items():
            ref = {
                tuple(p): t for p, t in zip(res["rows"], C.greedy(single, res["rows"]), strict=True)
            }
            assert res["tokens"] == [ref[tuple(p)] for p in res["rows"]], (name, r)
            assert res["shared"] == (name != "fsdp_gen_tp2")
    assert out["tp2"][0]["tokens"] == out["tp2"][1]["tokens"]  # the tp ranks decode alike
    assert len(out["fsdp"][0]["tokens"]) == 3 and len(out["fsdp"][1]["tokens"]) == 2


@pytest.mark.parametrize("where", ["local", "memory"])
def test_shard_checkpoint_round_trip_in_one_process(tmp_path, where):
    """One process, no process group: DCP writes plain tensors; an fsspec URL works like a
    folder; a second save replaces the first atomically (no .tmp or .old left)."""
    import uuid

    import fsspec

    from rpeg.runtime.actors.shard_checkpoint import (
        load_shards,
        restore_extras,
        save_shards,
        worker_extras,
        worker_roles,
    )

    url = str(tmp_path / "ck") if where == "local" else f"memory://ck-{uuid.uuid4().hex}"
    cfg = C.config()
    m, tok = C.model()
    w = C.policy(cfg, m, tok)
    w.train_step(C.with_old_logprobs(C.batch(0), w))
    save_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    w.train_step(C.with_old_logprobs(C.batch(1), w))
    save_shards(url, worker_roles(actor=w), worker_extras(actor=w))  # replaces the first
    fs, path = fsspec.core.url_to_fs(url)
    assert fs.exists(path) and not fs.exists(path + ".tmp") and not fs.exists(path + ".old")

    m2, _ = C.model()
    v = C.policy(cfg, m2, tok)
    restore_extras(load_shards(url, worker_roles(actor=v), worker_extras(actor=v)), actor=v)
    assert v.policy_version == 2
    for k, t in w.lm.state_dict().items():
        assert torch.equal(v.lm.state_dict()[k], t), k
    s_w, s_v = w.optimizer.state_dict()["state"], v.optimizer.state_dict()["state"]
    assert s_w.keys() == s_v.keys()
    for i in s_w:
        assert torch.equal(s_w[i]["exp_avg_sq"], s_v[i]["exp_avg_sq"])
    assert torch.equal(w.generator.get_state(), v.generator.get_state())


def test_gradient_buckets_keep_order_dtype_and_size():
    from rpeg.runtime.sharding import grad_buckets

    f32 = [torch.zeros(n) for n in (3, 4, 2, 10)]  # 12, 16, 8, 40 bytes
    half = torch.zeros(2, dtype=torch.float16)
    got = grad_buckets([f32[0], f32[1], half, f32[2], f32[3]], bucket_bytes=30)
    shapes = [[(t.numel(), t.dtype) for t in b] for b in got]
    assert shapes == [
        [(3, torch.float32), (4, torch.float32)],  # 28 <= 30
        [(2, torch.float16)],  # a dtype change starts a bucket
        [(2, torch.float32)],
        [(10, torch.float32)],  # 8 + 40 > 30; larger than a bucket: its own
    ]
    assert grad_buckets([], 30) == []


def test_fsdp_units_group_blocks_up_to_the_size():
    from torch import nn

    from rpeg.runtime.sharding import fsdp_units

    blocks = [nn.Linear(32, 32, bias=False) for _ in range(5)]  # 4096 bytes each
    ids = [[blocks.index(b) for b in u] for u in fsdp_units(blocks, unit_bytes=8192)]
    assert ids == [[0, 1], [2, 3]]  # block 4 (under the size) joins the root
    assert [[blocks.index(b) for b in u] for u in fsdp_units(blocks, 1)] == [[i] for i in range(5)]
    assert fsdp_units(blocks, 10**9) == []  # a small model: one unit, the root


@pytest.mark.parametrize("chunk_bytes", [None, 1, 64])
def test_adamw_step_equals_torch_adamw(chunk_bytes, monkeypatch):
    """The optimizer's own step (local tensors of DTensor parameters) on plain tensors is
    torch's AdamW (to 1e-7: foreach and per-tensor kernels may round differently), weight
    decay included; also when the multi-tensor update runs in chunks of whole tensors (1
    byte: a tensor a call; 64 bytes: the small tensors together, the 60-byte one alone)."""
    from rpeg.runtime import updates
    from rpeg.runtime.updates import adamw

    if chunk_bytes is not None:
        monkeypatch.setattr(updates, "OPTIMIZER_CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(0)
    ours = [
        torch.nn.Parameter(torch.randn(5, 3, generator=g)),
        torch.nn.Parameter(torch.randn(4)),
        torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    ]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    a = adamw(ours, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    b = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), foreach=False)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in ours]
        for p, q, gr in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_adamw_is_fused_where_every_parameter_allows_it():
    """The fused update (one kernel per step) on float CPU parameters, foreach where one
    parameter cannot take it (on the meta device); a state dict saved by a foreach optimizer
    loads into a fused one and keeps it fused, its steps counting on."""
    from rpeg.runtime.updates import adamw

    p = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    fused = adamw(p, lr=1e-2)
    assert fused.param_groups[0]["fused"] and not fused.param_groups[0]["foreach"]
    meta = adamw([torch.nn.Parameter(torch.empty(3, device="meta")), *p], lr=1e-2)
    assert meta.param_groups[0]["foreach"] and not meta.param_groups[0]["fused"]
    groups = adamw([{"params": p[:1]}, {"params": p[1:], "weight_decay": 0.0}], lr=1e-2)
    assert all(g["fused"] for g in groups.param_groups)

    q = [torch.nn.Parameter(x.detach().clone()) for x in p]
    old = torch.optim.AdamW(q, lr=1e-2, foreach=True)
    for x in q:
        x.grad = torch.ones_like(x)
    old.step()
    old.step()
    fused.load_state_dict(old.state_dict())
    assert fused.param_groups[0]["fused"] and not fused.param_groups[0]["foreach"]
    for x in p:
        x.grad = torch.ones_like(x)
    fused.step()
    assert float(fused.state[p[0]]["step"]) == 3.0
