"""LoRA on the policy (model.lora, rpeg.runtime.lora): adapter counts, only adapters in the
optimizer and the checkpoint, merged weights for weight sync, the reference as the base, and
the refusals (bad values, unknown target modules). Tensor parallelism: test_lora_tp.py."""

import copy

import pytest
import torch

from rpeg.config import TINY_LINEAR_MODULES, LoraSection, RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime import lora as L
from rpeg.runtime.role_state import load_role_state, role_state
from rpeg.runtime.roles import PolicyWorker

pytest.importorskip("peft")


def _lora(tiny, rank=4, alpha=8.0, targets=("q_proj", "v_proj")):
    model, tok = tiny
    m = L.apply_lora(
        copy.deepcopy(model), LoraSection(rank=rank, alpha=alpha, target_modules=list(targets))
    )
    return m, tok


# ------------------------------------------------------------------------------ config
def test_config_names_the_field_of_bad_values():
    with pytest.raises(ConfigError, match=r"model\.lora\.rank"):
        RunConfig.from_yaml("model: {lora: {rank: 0}}")
    with pytest.raises(ConfigError, match=r"model\.lora\.dropout"):
        RunConfig.from_yaml("model: {lora: {dropout: 1.0}}")
    with pytest.raises(ConfigError, match=r"model\.lora\.alpha"):
        RunConfig.from_yaml("model: {lora: {alpha: 0}}")
    with pytest.raises(ConfigError, match=r"qkv_proj.*allowed: q_proj, k_proj"):
        RunConfig.from_yaml("model: {lora: {target_modules: [qkv_proj]}}")
    # default off; {} takes the section's defaults
    assert RunConfig().model.lora is None
    lo = RunConfig.from_yaml("model: {lora: {}}").model.lora
    assert (lo.rank, lo.alpha, lo.target_modules, lo.scale) == (8, 16.0, ["q_proj", "v_proj"], 2.0)


def test_unknown_target_is_checked_against_the_model(tiny):
    model, _ = tiny
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules.*\['wq'\].*down_proj"):
        L.apply_lora(copy.deepcopy(model), LoraSection(target_modules=["q_proj", "wq"]))


# ------------------------------------------------------------------------------ counts
def test_adapter_count_by_hand(tiny):
    """The tiny fixture: hidden d = 64, 2 layers. Rank r on q_proj and v_proj (each d x d):
    A is r x d, B is d x r -> 2 * r * d = 2 * 4 * 64 = 512 per module; 2 modules x 2 layers
    -> 2,048. The base keeps all its parameters (and they are frozen)."""
    base_total = sum(p.numel() for p in tiny[0].parameters())
    m, _ = _lora(tiny, rank=4)
    adapters, total = L.param_counts(m)
    assert adapters == 2048
    assert total == base_total + 2048
    assert sum(p.numel() for p in m.parameters() if p.requires_grad) == 2048
    # rank 1 on all seven Linear kinds: q,k,v,o are 64x64 (2*64 each), gate/up 64->128 and
    # down 128->64 (64 + 128 each): 4*128 + 3*192 = 1,088 per layer, 2,176 for 2 layers
    m1, _ = _lora(tiny, rank=1, targets=L.linear_names(tiny[0]))
    assert L.linear_names(tiny[0]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # what the config checks model.lora.target_modules against without model.path
    assert sorted(TINY_LINEAR_MODULES) == L.linear_names(tiny[0])
    assert L.param_counts(m1)[0] == 2176


def test_optimizer_holds_only_adapters_and_the_base_stays(tiny):
    m, tok = _lora(tiny)
    w = PolicyWorker(m, tok)
    in_opt = {id(p) for g in w.optimizer.param_groups for p in g["params"]}
    adapters = {id(p) for n, p in m.named_parameters() if L.is_adapter_key(n)}
    assert in_opt == adapters and len(adapters) == 8  # 2 layers x 2 modules x (A, B)
    base_before = {k: v.clone() for k, v in m.state_dict().items() if not L.is_adapter_key(k)}
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    w.optimizer.step()
    for k, v in m.state_dict().items():
        if not L.is_adapter_key(k):
            assert torch.equal(v, base_before[k]), k
    b = m.get_submodule("model.layers.0.self_attn.q_proj").lora_B["default"].weight
    assert b.abs().sum() > 0  # B started at zero and moved


# ------------------------------------------------------------------------------ merged
def test_merged_weights_equal_w_plus_scale_b_a(tiny):
    """rank 1, alpha 4 -> scale 4. A = e_0 (1 x 64), B = 2 e_3 (64 x 1): B @ A is 2 at
    [3, 0] and 0 elsewhere, so the merged q_proj differs from W only at [3, 0], by 4 * 2 = 8.
    Names are the base model's; no adapter tensor is sent."""
    model, _ = tiny
    m, _ = _lora(tiny, rank=1, alpha=4.0, targets=("q_proj",))
    q = m.get_submodule("model.layers.0.self_attn.q_proj")
    with torch.no_grad():
        q.lora_A["default"].weight.zero_()[0, 0] = 1.0
        q.lora_B["default"].weight.zero_()[3, 0] = 2.0
    merged = L.sync_state(m)
    assert set(merged) == set(model.state_dict())
    w = model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    diff = merged["model.layers.0.self_attn.q_proj.weight"] - w
    expect = torch.zeros_like(w)
    expect[3, 0] = 8.0
    assert torch.allclose(diff, expect, atol=1e-6)
    # layer 1's adapter is still zero (B = 0): its weight is W exactly
    k1 = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(merged[k1], model.state_dict()[k1])
    # one tensor at a time (weight sync's buckets) gives the same, in the compute dtype
    meta, fetch = L.sync_source(m, torch.bfloat16)
    assert meta.keys() == merged.keys()
    assert fetch("model.layers.0.self_attn.q_proj.weight").dtype == torch.bfloat16


def test_a_plain_model_with_the_merged_weights_computes_the_lora_model(tiny):
    model, _ = tiny
    m, _ = _lora(tiny)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.05)
    plain = copy.deepcopy(model)
    plain.load_state_dict(L.sync_state(m))
    ids = torch.tensor([[1, 4, 9, 16, 25, 36, 2]])
    assert torch.allclose(plain(ids).logits, m(ids).logits, atol=1e-5)
    # the adapters disabled: the base model's logits; enabled again afterwards
    with L.adapters_disabled(m):
        assert torch.allclose(m(ids).logits, model(ids).logits, atol=1e-6)
    assert torch.allclose(plain(ids).logits, m(ids).logits, atol=1e-5)
    assert all(p.requires_grad for n, p in m.named_parameters() if L.is_adapter_key(n))


def test_base_copy_has_no_adapters_and_the_base_weights(tiny):
    model, _ = tiny
    m, _ = _lora(tiny)
    c = L.base_copy(m)
    assert not L.has_lora(c) and L.has_lora(m)
    assert c.state_dict().keys() == model.state_dict().keys()
    assert all(p.requires_grad for p in c.parameters())


# ------------------------------------------------------------------------------ checkpoint
def test_checkpoint_holds_only_adapters_and_resumes(tiny):
    m, tok = _lora(tiny)
    w = PolicyWorker(m, tok)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    m(input_ids=ids, labels=ids).loss.backward()
    w.optimizer.step()
    weights, optim = role_state(w.module, w.optimizer, None)
    assert len(weights) == 8 and all(L.is_adapter_key(k) for k in weights)
    assert len(optim["state"]) == 8  # AdamW moments of the 8 adapter tensors only
    # a fresh LoRA worker (B = 0) takes the adapters and the optimizer state back
    m2, _ = _lora(tiny)
    w2 = PolicyWorker(m2, tok)
    load_role_state(w2.module, w2.optimizer, {"module": weights, "optimizer": optim}, None)
    assert torch.allclose(m2(ids).logits, m(ids).logits, atol=1e-6)
    assert w2.optimizer.state_dict()["state"][0]["step"] == 1
    with pytest.raises(KeyError, match="same model.lora"):
        m3, _ = _lora(tiny, targets=("q_proj",))
        load_role_state(m3, None, {"module": weights}, None)


def test_a_lora_model_built_on_meta_starts_as_the_whole_one():
    """A rank of a sharded layout builds the LoRA policy on the meta device and fills it from
    the base model's tensors (``lora_fetch``: base_layer names to base names, adapters at
    their named-seed init): every tensor equals the model built whole, A is drawn (nonzero,
    within peft's Kaiming bound) and B is zero; another seed draws other adapters."""
    import math

    from rpeg.runtime.materialize import ModuleSource, materialize, meta_causal_lm
    from rpeg.runtime.model_io import create_tiny

    sec = LoraSection(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])
    whole, _ = create_tiny(seed=0)
    base = copy.deepcopy(whole)
    whole = L.apply_lora(whole, sec, seed=7)
    meta = L.apply_lora(meta_causal_lm(base.config, torch.float32), sec, seed=7)
    materialize(meta, torch.device("cpu"), L.lora_fetch(ModuleSource(base).fetch, 7, meta))
    got, want = meta.state_dict(), whole.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    a = next(v for k, v in want.items() if ".lora_A." in k)
    assert a.abs().max() > 0 and a.abs().max() <= 1 / math.sqrt(a.shape[1])
    assert all(v.abs().max() == 0 for k, v in want.items() if ".lora_B." in k)
    other = L.apply_lora(copy.deepcopy(base), sec, seed=8)
    k = next(k for k in want if ".lora_A." in k)
    assert not torch.equal(other.state_dict()[k], want[k])


# ------------------------------------------------------------------------------ layouts
@pytest.mark.slow  # two spawned ranks: ~10 s on 2 cores
def test_fsdp_dp2_lora_equals_single_process():
    """FSDP wraps the injected model: one step at dp=2 gives the single-process merged
    weights; the sharded checkpoint holds the 8 adapter tensors only and reloads exactly."""
    import lora_cases

    ref_metrics, ref_merged = lora_cases.reference()
    out = lora_cases.spawn(port=29671)
    for r in (0, 1):
        assert out[r]["reloaded_equal"], r
        assert len(out[r]["saved_keys"]) == 8
        assert all(L.is_adapter_key(k) for k in out[r]["saved_keys"])
        assert out[r]["metrics"]["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], abs=1e-5)
    for key in ("pg_loss", "kl", "entropy"):  # each rank's share of the global loss
        mean = (out[0]["metrics"][key] + out[1]["metrics"][key]) / 2
        assert mean == pytest.approx(ref_metrics[key], abs=1e-5), key
    merged = out[0]["merged"]
    assert set(merged) == set(ref_merged)
    for k, v in ref_merged.items():
        torch.testing.assert_close(merged[k], v, atol=1e-5, rtol=0, msg=k)
    # built on the meta device and filled shard by shard (adapters at their named-seed init,
    # B zero as a run starts): the same step as one process built whole
    start_metrics, start_merged = lora_cases.reference(nonzero_b=False)
    assert out[0]["meta_metrics"]["grad_norm"] == pytest.approx(
        start_metrics["grad_norm"], abs=1e-5
    )
    for k, v in start_merged.items():
        torch.testing.assert_close(out[0]["meta_merged"][k], v, atol=1e-5, rtol=0, msg=k)


def test_dcp_shards_of_a_lora_policy_hold_only_adapters(tmp_path, tiny):
    """A sharded group's torch.distributed.checkpoint shards (here one process, no process
    group): the model part holds the 8 adapter tensors only; a fresh LoRA worker loads them."""
    import torch.distributed.checkpoint as dcp

    from rpeg.runtime.actors.shard_checkpoint import load_shards, save_shards, worker_roles

    m, tok = _lora(tiny)
    w = PolicyWorker(m, tok)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    m(input_ids=ids, labels=ids).loss.backward()
    w.optimizer.step()
    url = str(tmp_path / "shards")
    save_shards(url, worker_roles(actor=w))
    saved = dcp.FileSystemReader(url).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("actor.model.")]
    assert len(model_keys) == 8 and all(L.is_adapter_key(k) for k in model_keys)
    m2, _ = _lora(tiny)
    w2 = PolicyWorker(m2, tok)
    load_shards(url, worker_roles(actor=w2))
    assert torch.allclose(m2(ids).logits, m(ids).logits, atol=1e-6)
    assert w2.optimizer.state_dict()["state"][0]["step"] == 1


def test_resume_with_another_lora_setting_is_refused():
    from rpeg.runtime.actors.checkpoint_identity import mismatches, model_identity

    with_lora = RunConfig.from_yaml("model: {lora: {rank: 4}}").model
    meta = {"step": 2, "run_id": "r", "model": model_identity(with_lora)}
    assert mismatches(meta, with_lora, local=None) == []
    for other in (RunConfig().model, RunConfig.from_yaml("model: {lora: {rank: 8}}").model):
        (p,) = mismatches(meta, other, local=None)
        assert p.where == "model" and "policy lora=" in p.what


def test_preflight_accepts_every_layout_and_refuses_unknown_targets(tmp_path, tiny):
    """Before anything starts: a plan whose actor-training group has tp=2 is accepted (the
    adapters are split with their targets, rpeg.runtime.lora_tp); a model folder (its
    config.json only, built on the meta device) without the named Linear is refused."""
    from types import SimpleNamespace

    from rpeg.compile import GroupSpec
    from rpeg.preflight.lora import check_lora

    cfg = RunConfig.from_yaml("model: {lora: {rank: 4}}")
    tp2 = GroupSpec("g0", (0, 1), 2, ("actor",), ("actor",), (), dp=1, tp=2)
    dp2 = GroupSpec("g1", (0, 1), 2, ("actor",), ("actor",), (), dp=2, tp=1)
    assert check_lora(cfg, SimpleNamespace(actor_groups=(tp2, dp2))) == []
    folder = tmp_path / "m"
    tiny[0].config.save_pretrained(folder)
    bad = RunConfig.from_yaml(
        f"model: {{path: {folder}, lora: {{target_modules: [q_proj, wq, query_key_value]}}}}"
    )
    (p,) = check_lora(bad)
    assert p.where == "model.lora.target_modules"
    assert "['wq', 'query_key_value']" in p.what and "v_proj" in p.what
    ok = RunConfig.from_yaml(f"model: {{path: {folder}, lora: {{target_modules: [o_proj]}}}}")
    assert check_lora(ok) == []
