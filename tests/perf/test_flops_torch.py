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
from tests.perf.hf_configs import catalog_spec, deepseek_v3_small, qwen3_moe_small  # noqa: E402


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
    spec = catalog_spec(cfg)
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
    cfg = qwen3_moe_small()
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    spec = catalog_spec(cfg)
    assert spec.moe is not None and spec.moe.top_k == 2
    T = 64
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    assert _count(model, ids) == pytest.approx(_expected_forward(spec, T), rel=5e-3)


def test_mla_moe_deepseek_v3_shared_expert_and_dense_first_layers():
    torch.manual_seed(0)
    cfg = deepseek_v3_small()
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    spec = catalog_spec(cfg)
    assert spec.mla is not None and spec.moe.first_dense_layers == 1
    T = 64
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    assert _count(model, ids) == pytest.approx(_expected_forward(spec, T), rel=5e-3)
