"""The FLOP terms of the model against torch's own count (torch.utils.flop_counter) on the
real Hugging Face model classes, one per architecture family of the catalog:

* dense GQA (Qwen2.5-7B): the real shape on the meta device (no memory, no download),
  forward and forward+backward at 2,048 tokens; tolerance 0.1%;
* MoE (Qwen3-MoE) and MLA + MoE with shared experts and dense first layers (DeepSeek-V3):
  scaled-down configs of the same classes with real CPU tensors (routing is data-dependent,
  so these cannot run on meta); tolerance 0.5% (the catalog counts q/k/kv norm weights
  among the matmul parameters: <0.3% at these widths, 0.01% at real widths).

torch counts the whole score square (eager/math attention computes masked entries too); the
model counts the causal half, which flash kernels execute, so the comparison doubles the
model's attention term. The catalog entries are built from the configs by the same mapping
``rpeg specs add-model --from-hf`` uses. A miss here is a formula bug, not a constant to tune.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from rpeg.perf import costs  # noqa: E402
from rpeg.specs.hf import entry_from_hf  # noqa: E402
from rpeg.specs.models import parse_models  # noqa: E402


def _spec(cfg, name="m"):
    entry = entry_from_hf(cfg.to_dict())
    return parse_models([({"models": {name: entry}}, "test")])[name]


def _expected_forward(spec, tokens):
    return 2.0 * spec.matmul_params * tokens + 2.0 * costs.attn_fwd_flops(spec, tokens * tokens)


def _count(model, ids, backward=False):
    with FlopCounterMode(display=False) as fc:
        out = model(input_ids=ids)
        if backward:
            out.logits.sum().backward()
    return fc.get_total_flops()


def test_dense_gqa_qwen2_7b_real_shape_on_meta():
    cfg = transformers.Qwen2Config(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(cfg)
    spec = _spec(cfg)
    T = 2048
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    fwd = _count(model, ids)
    assert fwd == pytest.approx(_expected_forward(spec, T), rel=1e-3)
    both = _count(model, ids, backward=True)  # backward = 2 x forward for every matmul
    expected = costs.train_flops(spec, T, T * T, recompute=False) + 3.0 * costs.attn_fwd_flops(
        spec, T * T
    )
    assert both == pytest.approx(expected, rel=1e-3)
    assert both / 1e12 == pytest.approx(91.9, abs=0.1)  # the figure in issue 13


def test_moe_qwen3_moe_router_and_top_k_experts():
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # per-expert linears torch can count
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    spec = _spec(cfg)
    assert spec.moe is not None and spec.moe.top_k == 2
    T = 64
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    assert _count(model, ids) == pytest.approx(_expected_forward(spec, T), rel=5e-3)


def test_mla_moe_deepseek_v3_shared_expert_and_dense_first_layers():
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        vocab_size=512,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    spec = _spec(cfg)
    assert spec.mla is not None and spec.moe.first_dense_layers == 1
    T = 64
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    assert _count(model, ids) == pytest.approx(_expected_forward(spec, T), rel=5e-3)
