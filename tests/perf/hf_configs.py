"""Hugging Face configs the torch cross-checks build models from (one per architecture family
of the catalog), and the catalog entry each maps to (the ``rpeg specs add-model --from-hf``
mapping). Shared by test_flops_torch.py and test_memory_torch.py."""

import transformers

from rpeg.specs.hf import entry_from_hf
from rpeg.specs.models import parse_models


def catalog_spec(cfg, name: str = "m"):
    """The ModelSpec the catalog builds from ``cfg``."""
    entry = entry_from_hf(cfg.to_dict())
    return parse_models([({"models": {name: entry}}, "test")])[name]


def qwen25_05b_two_layers():
    """Qwen2.5-0.5B's width (dense GQA, tied embeddings), 2 of its 24 layers."""
    cfg = transformers.Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def qwen3_moe_small():
    """Qwen3-MoE scaled down: router + top-2 of 8 experts in every layer."""
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
    return cfg


def deepseek_v3_small():
    """DeepSeek-V3 scaled down: MLA, a shared expert, one dense first layer."""
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
    return cfg
