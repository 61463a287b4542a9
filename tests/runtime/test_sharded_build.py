"""Sharded construction (rpeg.runtime.materialize): a role built on the meta device, laid
out, then given storage for its shard alone and filled from a source one tensor at a time,
trains exactly as the role built whole and then sharded (and as one process), and a rank
holds its share only."""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch
from test_sharding import LOSSES, PPO, _check


def test_meta_model_filled_from_a_safetensors_folder_gives_the_same_logits(tmp_path):
    """One process: the model of a Hugging Face folder built on meta and filled tensor by
    tensor from its files equals transformers' own load (tied head and rotary buffers too)."""
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.materialize import SafetensorsSource, materialize, meta_causal_lm, on_meta

    m, _ = C.model()
    m.save_pretrained(tmp_path, safe_serialization=True)
    meta = meta_causal_lm(m.config, torch.float32)
    assert on_meta(meta)
    held = materialize(meta, torch.device("cpu"), SafetensorsSource(tmp_path).fetch)
    assert not on_meta(meta)
    assert meta.lm_head.weight is meta.model.embed_tokens.weight  # tied again
    assert held == sum(p.numel() * 4 for p in m.parameters())  # tied counted once
    ids = torch.tensor([[1, 5, 9, 14, 2, 7]])
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(meta(ids).logits, loaded(ids).logits, atol=0, rtol=0)


def test_a_source_missing_a_tensor_or_with_another_shape_is_named(tmp_path):
    from rpeg.runtime.materialize import ModuleSource, materialize, meta_causal_lm

    m, _ = C.model()
    src = ModuleSource(m)

    def lacking(name):
        return None if name.endswith("mlp.up_proj.weight") else src.fetch(name)

    with pytest.raises(KeyError, match="actor: the weights lack .*up_proj"):
        materialize(meta_causal_lm(m.config, torch.float32), torch.device("cpu"), lacking, "actor")
    other = C.model()[0].config
    other.intermediate_size = 96
    with pytest.raises(ValueError, match=r"gate_proj.weight has shape \(128, 64\) in the source"):
        materialize(meta_causal_lm(other, torch.float32), torch.device("cpu"), src.fetch)


@pytest.mark.slow  # two spawned ranks (~20 s on 2 cores)
def test_sharded_construction_trains_as_the_whole_model():
    """fsdp dp=2 and tp=2, the actor, an actor-critic and a separate critic built on meta:
    the first step's losses, gradient norm and weights after equal one process (1e-5) --
    so the initial weights (the logits) and the update are today's; each rank holds about
    half of the FSDP-sharded role."""
    ref = C.reference_first_step(C.config())
    shared = C.reference_first_step(C.config(**PPO))
    crit = C.reference_first_step(C.config(**{"algorithm.name": "ppo"}), role="critic")
    fsdp, tp2 = {"dp": 2, "fsdp": True}, {"tp": 2}
    critic = {"role": "critic", "over": {"algorithm.name": "ppo"}}
    cases = [
        ("fsdp", "train", {"layout": fsdp, "meta": True}),
        ("tp2", "train", {"layout": tp2, "meta": True}),
        ("shared_fsdp", "train", {"layout": fsdp, "over": PPO, "meta": True}),
        ("critic_fsdp", "train", {"layout": fsdp, **critic, "meta": True}),
        ("critic_tp2", "train", {"layout": tp2, **critic, "meta": True}),
    ]
    out = C.spawn(2, cases, port=29697)
    _check(*ref, out["fsdp"], 2, 1)
    _check(*ref, out["tp2"], 1, 2)
    _check(*shared, out["shared_fsdp"], 2, 1, keys=(*LOSSES, "value_loss"))
    _check(*crit, out["critic_fsdp"], 2, 1, keys=("value_loss",))
    _check(*crit, out["critic_tp2"], 1, 2, keys=("value_loss",))
    for rank in (0, 1):
        assert out["fsdp"][rank]["local"] <= 0.55 * out["fsdp"][rank]["full"]
