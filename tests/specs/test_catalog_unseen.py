"""Checkpoints of unseen publications' RL runs (models.yaml, "added 2026-12-06"): the names
published runs write resolve onto the intended catalog entry with the kind their model card
gives, and every new architecture's derived parameter count meets the figure its vendor
publishes (within 2%; rpeg/specs/models.py derives it from the config fields)."""

import pytest

from rpeg import specs
from rpeg.perf.validation.row_cells import resolve_model

# (name as a run writes it, catalog entry, kind the name's suffix states or None, the
# checkpoint's kind from its model card)
CASES = [
    ("deepseek-ai/DeepSeek-V2-Chat", "deepseek-v2", "instruct", "instruct"),
    ("DeepSeek-V2.5", "deepseek-v2.5", None, "instruct"),
    ("deepseek-ai/DeepSeek-Coder-V2-Instruct", "deepseek-coder-v2", "instruct", "instruct"),
    ("mistralai/Devstral-Small-2505", "devstral-small", None, "instruct"),
    ("microsoft/Phi-3-mini-128k-instruct", "phi-3-mini-128k", "instruct", "instruct"),
    ("microsoft/Phi-3.5-mini-instruct", "phi-3.5-mini", "instruct", "instruct"),
    ("Qwen/Qwen2.5-Math-72B", "qwen2.5-math-72b", None, "base"),
    ("Qwen2.5-Math-72B-Instruct", "qwen2.5-math-72b", "instruct", "instruct"),
    ("mistralai/Mistral-Nemo-Instruct-2407", "mistral-nemo", "instruct", "instruct"),
    ("Mistral-Nemo-Base-2407", "mistral-nemo", "base", "base"),
    ("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b", "instruct", "instruct"),
    ("Mistral-Small-24B-Base-2501", "mistral-small-24b", "base", "base"),
    (
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        "mistral-small-3.1-24b",
        "instruct",
        "instruct",
    ),
    ("mistralai/Magistral-Small-2506", "magistral-small", None, "reasoning"),
    ("Ministral-8B-Instruct-2410", "ministral-8b", "instruct", "instruct"),
    ("google/gemma-3-1b-it", "gemma-3-1b", "instruct", "instruct"),
    ("gemma-3-4b-it", "gemma-3-4b", "instruct", "instruct"),
    ("gemma-3-12b-it", "gemma-3-12b", "instruct", "instruct"),
    ("gemma-3-27b-it", "gemma-3-27b", "instruct", "instruct"),
    ("gemma-3-4b-pt", "gemma-3-4b", None, "base"),
    ("google/gemma-7b", "gemma-7b", None, "base"),
    ("gemma-7b-it", "gemma-7b", "instruct", "instruct"),
    (
        "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF",
        "llama3.1-nemotron-70b",
        "instruct",
        "instruct",
    ),
    ("THUDM/GLM-4-9B-0414", "glm-4-9b", None, "instruct"),
    ("THUDM/GLM-Z1-9B-0414", "glm-z1-9b", None, "reasoning"),
    ("XiaomiMiMo/MiMo-7B-Base", "mimo-7b", "base", "base"),
    ("XiaomiMiMo/MiMo-7B-RL", "mimo-7b-rl", None, "reasoning"),
    ("internlm/internlm2_5-7b-chat", "internlm2.5-7b", "instruct", "instruct"),
    ("ByteDance-Seed/Seed-OSS-36B-Instruct", "seed-oss-36b-instruct", None, "reasoning"),
    ("Seed-OSS-36B-Base", "seed-oss-36b-instruct", "base", "base"),
    ("allenai/OLMo-2-1124-13B", "olmo-2-1124-13b", None, "base"),
    ("OLMo-2-1124-13B-Instruct", "olmo-2-1124-13b", "instruct", "instruct"),
    ("allenai/OLMo-2-0325-32B", "olmo-2-0325-32b", None, "base"),
    ("allenai/Olmo-3-7B", "olmo-3-7b", None, "base"),
    ("allenai/Olmo-3-7B-Think", "olmo-3-7b-think", None, "reasoning"),
    ("allenai/Olmo-3-32B-Think", "olmo-3-32b-think", None, "reasoning"),
    ("microsoft/Phi-4-mini-instruct", "phi-4-mini", "instruct", "instruct"),
    ("microsoft/Phi-4-reasoning", "phi-4-reasoning", None, "reasoning"),
    ("Phi-4-reasoning-plus", "phi-4-reasoning-plus", None, "reasoning"),
    ("Phi-4-mini-reasoning", "phi-4-mini-reasoning", None, "reasoning"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "smollm2-1.7b", "instruct", "instruct"),
    ("Qwen/Qwen2-VL-7B-Instruct", "qwen2-vl-7b-instruct", None, "instruct"),
    ("OpenGVLab/InternVL3-8B", "internvl3-8b", None, "instruct"),
    ("nvidia/OpenMath-Nemotron-7B", "openmath-nemotron-7b", None, "reasoning"),
    ("nvidia/AceReason-Nemotron-7B", "acereason-nemotron-7b", None, "reasoning"),
    ("nvidia/AceReason-Nemotron-14B", "acereason-nemotron-14b", None, "reasoning"),
    ("qihoo360/Light-R1-32B", "light-r1-32b", None, "reasoning"),
    ("open-thoughts/OpenThinker2-32B", "openthinker2-32b", None, "reasoning"),
    ("open-thoughts/OpenThinker2-7B", "openthinker2-7b", None, "reasoning"),
    ("open-thoughts/OpenThinker3-7B", "openthinker3-7b", None, "reasoning"),
    ("nvidia/OpenReasoning-Nemotron-32B", "openreasoning-nemotron-32b", None, "reasoning"),
    ("nvidia/OpenReasoning-Nemotron-14B", "openreasoning-nemotron-14b", None, "reasoning"),
    ("nvidia/OpenReasoning-Nemotron-7B", "openreasoning-nemotron-7b", None, "reasoning"),
    ("POLARIS-Project/Polaris-4B-Preview", "polaris-4b-preview", None, "reasoning"),
    ("POLARIS-Project/Polaris-7B-Preview", "polaris-7b-preview", None, "reasoning"),
    ("Qwen/Qwen1.5-7B-Chat", "qwen1.5-7b", "instruct", "instruct"),
    ("deepseek-ai/deepseek-coder-6.7b-instruct", "deepseek-coder-6.7b", "instruct", "instruct"),
    ("deepseek-ai/deepseek-math-7b-base", "deepseek-math-7b", "base", "base"),
    ("deepseek-ai/deepseek-math-7b-instruct", "deepseek-math-7b", "instruct", "instruct"),
    ("deepseek-ai/deepseek-math-7b-rl", "deepseek-math-7b-rl", None, "instruct"),
    ("moonshotai/Kimi-Dev-72B", "kimi-dev-72b", None, "reasoning"),
    ("facebook/opt-1.3b", "opt-1.3b", None, "base"),
    ("facebook/opt-6.7b", "opt-6.7b", None, "base"),
    ("facebook/opt-13b", "opt-13b", None, "base"),
    ("facebook/opt-30b", "opt-30b", None, "base"),
    ("facebook/opt-66b", "opt-66b", None, "base"),
    (
        "Qwen/Qwen3-Coder-480B-A35B-Instruct",
        "qwen3-coder-480b-a35b-instruct",
        None,
        "instruct",
    ),
    ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite", None, "base"),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite", "instruct", "instruct"),
    (
        "deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct",
        "deepseek-coder-v2-lite",
        "instruct",
        "instruct",
    ),
    ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3.1", None, "instruct"),
    ("DeepSeek-V3.1-Base", "deepseek-v3.1", "base", "base"),
    ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseek-v3.1-terminus", None, "instruct"),
    ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek-v3.2-exp", None, "instruct"),
    ("deepseek-ai/DeepSeek-V3.2", "deepseek-v3.2", None, "instruct"),
    ("moonshotai/Moonlight-16B-A3B", "moonlight-16b-a3b", None, "base"),
    ("moonshotai/Moonlight-16B-A3B-Instruct", "moonlight-16b-a3b", "instruct", "instruct"),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b-instruct", None, "instruct"),
    ("mistralai/Mixtral-8x22B-v0.1", "mixtral-8x22b-instruct", "base", "base"),
    ("zai-org/GLM-4.6", "glm-4.6", None, "reasoning"),
    ("MiniMaxAI/MiniMax-M2", "minimax-m2", None, "reasoning"),
    ("Qwen/Qwen1.5-MoE-A2.7B", "qwen1.5-moe-a2.7b", None, "base"),
    ("Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe-a2.7b", "instruct", "instruct"),
    ("Qwen/Qwen2-57B-A14B", "qwen2-57b-a14b", None, "base"),
    ("Qwen2-57B-A14B-Instruct", "qwen2-57b-a14b", "instruct", "instruct"),
    (
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "llama4-scout-17b-16e-instruct",
        None,
        "instruct",
    ),
    ("meta-llama/Llama-4-Scout-17B-16E", "llama4-scout-17b-16e-instruct", "base", "base"),
]

#: the new architecture entries (not `same_as`) and their vendors' published totals (billions)
NEW_ARCHITECTURES = {
    "mistral-nemo": 12.25,
    "mistral-small-24b": 23.57,
    "mistral-small-3.1-24b": 24.01,
    "ministral-8b": 8.02,
    "gemma-3-1b": 1.0,
    "gemma-3-4b": 4.3,
    "gemma-3-12b": 12.19,
    "gemma-3-27b": 27.43,
    "gemma-7b": 8.54,
    "glm-4-9b": 9.4,
    "mimo-7b": None,
    "internlm2.5-7b": 7.74,
    "seed-oss-36b-instruct": 36,
    "olmo-2-1124-13b": 13.7,
    "olmo-2-0325-32b": 32.2,
    "olmo-3-7b": None,
    "olmo-3-32b": 32,
    "phi-4-mini": 3.84,
    "smollm2-1.7b": 1.71,
    "qwen2-vl-7b-instruct": 8.29,
    "internvl3-8b": 7.94,
    "qwen1.5-7b": 7.72,
    "deepseek-coder-6.7b": 6.74,
    "opt-1.3b": 1.3,
    "opt-6.7b": 6.7,
    "opt-13b": 12.85,
    "opt-30b": 30,
    "opt-66b": 66,
    "qwen3-coder-480b-a35b-instruct": 480,
    "deepseek-v2-lite": 15.7,
    "deepseek-v2": 236,
    "moonlight-16b-a3b": 16,
    "mixtral-8x22b-instruct": 141,
    "minimax-m2": 230,
    "qwen1.5-moe-a2.7b": 14.3,
    "qwen2-57b-a14b": 57,
    "llama4-scout-17b-16e-instruct": 109,
}

ARCH = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab", "moe", "mla")


@pytest.mark.parametrize(("written", "entry", "stated", "kind"), CASES)
def test_a_published_name_resolves_to_its_entry_and_kind(written, entry, stated, kind):
    assert resolve_model(written) == (entry, stated)
    assert (stated or specs.model(entry).kind) == kind


@pytest.mark.parametrize("name", sorted(NEW_ARCHITECTURES))
def test_a_new_architecture_meets_its_published_total(name):
    m = specs.model(name)
    assert m.published_params_b == NEW_ARCHITECTURES[name]  # the figure in models.yaml
    if m.published_params_b:
        assert m.params / 1e9 == pytest.approx(m.published_params_b, rel=0.02)
    if m.published_active_params_b:
        assert m.active_params / 1e9 == pytest.approx(m.published_active_params_b, rel=0.03)


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("magistral-small", "mistral-small-24b"),
        ("glm-z1-9b", "glm-4-9b"),
        ("mimo-7b-rl", "mimo-7b"),
        ("olmo-3-32b-think", "olmo-3-32b"),
        ("phi-4-reasoning", "phi-4"),
        ("openmath-nemotron-7b", "qwen2.5-math-7b"),
        ("deepseek-math-7b", "deepseek-llm-7b"),
        ("deepseek-coder-v2-lite", "deepseek-v2-lite"),
        ("deepseek-v3.2-exp", "deepseek-v3"),
        ("glm-4.6", "glm-4.5"),
        ("kimi-dev-72b", "qwen2.5-72b"),
        ("deepseek-v2.5", "deepseek-v2"),
        ("deepseek-coder-v2", "deepseek-v2"),
        ("devstral-small", "mistral-small-24b"),
        ("phi-3-mini-128k", "phi-3-mini-4k"),
        ("phi-3.5-mini", "phi-3-mini-4k"),
    ],
)
def test_a_fine_tune_has_its_base_architecture(name, base):
    m, b = specs.model(name), (specs.models().get(base) or specs.model(base + "-instruct"))
    assert [getattr(m, a) for a in ARCH] == [getattr(b, a) for a in ARCH]


def test_opt_relu_mlp_is_a_swiglu_of_the_same_work():
    # DeepSpeed-Chat's OPT: 2 matrices of h x 4h entered as 3 of h x 8h/3 (one row of rounding)
    for name in ("opt-1.3b", "opt-6.7b", "opt-13b", "opt-30b", "opt-66b"):
        m = specs.model(name)
        assert abs(m.dense_mlp_params - 2 * m.hidden * 4 * m.hidden) <= 2 * m.hidden


def test_an_uncompressed_mla_query_is_priced_at_its_size():
    # DeepSeek-V2-Lite / Moonlight: no q-lora; the rank stands for q_proj h x heads*(nope+rope)
    for name in ("deepseek-v2-lite", "moonlight-16b-a3b"):
        m = specs.model(name)
        q = m.mla.q_lora_rank * (m.hidden + 1 + m.heads * m.head_dim)
        assert q == pytest.approx(m.hidden * m.heads * m.head_dim, rel=1e-3)


def test_active_counts_published_without_what_they_leave_out():
    # DeepSeek-V2-Lite's "2.4B activated" leaves out the input table; Llama-4-Scout's "17B"
    # active is the LM alone (its vision tower in front of it)
    v2 = specs.model("deepseek-v2-lite")
    assert (v2.active_params - v2.vocab * v2.hidden) / 1e9 == pytest.approx(2.4, rel=0.03)
    scout = specs.model("llama4-scout-17b-16e-instruct")
    assert (scout.active_params - scout.vision_params) / 1e9 == pytest.approx(17, rel=0.03)
    assert scout.moe_layers == scout.layers  # interleave_moe_layer_step 1: every layer MoE
