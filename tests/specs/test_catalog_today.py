"""Today's RL models and GPUs in the shipped catalogs (added 2026-12-03): the names published
runs use resolve onto them, their derived counts meet the figures their vendors publish where
those figures count something other than ``params`` / ``active_params`` (the MTP layer in a
checkpoint total, the embedding tables left out of an "active" count, a vision tower in an
"A3B" name), and every new GPU prices on a cluster of its own."""

import pytest

from rpeg import specs
from rpeg.perf.validation.row_cells import gpu_name, resolve_model, unknown_names


def _mtp_params(m) -> int:
    """One MTP block as Qwen3.5 checkpoints store it: a full-attention decoder layer (dense MLP
    or the MoE with its shared expert and router), the 2h -> h projection and three norms; the
    embeddings and head are shared."""
    h = m.hidden
    if m.moe:
        mlp = (m.moe.experts + m.moe.shared_experts) * m.expert_params + h * m.moe.experts
    else:
        mlp = m.dense_mlp_params
    return m.attn_params + mlp + 2 * h * h + 5 * h


@pytest.mark.parametrize(
    ("written", "catalog", "kind"),
    [
        ("Qwen/Qwen3-VL-8B-Instruct", "qwen3-vl-8b-instruct", None),
        ("Qwen3-VL-8B-Thinking", "qwen3-vl-8b-instruct", "reasoning"),
        ("Qwen3-VL-30B-A3B-Instruct", "qwen3-vl-30b-a3b-instruct", None),
        ("Qwen3-VL-235B-A22B-Thinking", "qwen3-vl-235b-a22b-instruct", "reasoning"),
        ("Qwen2.5-VL-72B-Instruct", "qwen2.5-vl-72b-instruct", None),
        ("Qwen/Qwen3.5-35B-A3B", "qwen3.5-35b-a3b", None),
        ("Qwen3.5-397B-A17B", "qwen3.5-397b-a17b", None),
        ("openai/gpt-oss-120b", "gpt-oss-120b", None),
        ("GLM-4.5-Air", "glm-4.5-air", None),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1", None),
        ("DeepSeek-R1-0528", "deepseek-r1", None),
        ("moonshotai/Kimi-K2-Instruct", "kimi-k2-instruct", None),
        ("Kimi-K2-Thinking", "kimi-k2-instruct", "reasoning"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama3.3-70b-instruct", None),
        ("Mixtral-8x7B-Instruct", "mixtral-8x7b-instruct", None),
        ("Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder-30b-a3b-instruct", None),
    ],
)
def test_published_names_resolve(written, catalog, kind):
    assert resolve_model(written) == (catalog, kind)


def test_deepseek_r1_is_v3_with_a_reasoning_prior():
    r1, v3 = specs.model("deepseek-r1"), specs.model("deepseek-v3")
    assert r1.kind == "reasoning" and (r1.params, r1.active_params) == (v3.params, v3.active_params)
    assert r1.kv_bytes_per_token(2) == v3.kv_bytes_per_token(2)


def test_qwen35_9b_plus_its_mtp_layer_is_the_checkpoint_total():
    # the checkpoint's index.json total_size 19,306,216,416 bytes of bf16 (the entry's source)
    m = specs.model("qwen3.5-9b")
    assert m.params + _mtp_params(m) == pytest.approx(19_306_216_416 / 2, rel=1e-4)


@pytest.mark.parametrize(
    ("name", "sibling"),
    [
        ("qwen3-vl-4b-instruct", "qwen3-4b"),
        ("qwen3-vl-8b-instruct", "qwen3-8b"),
        ("qwen3-vl-32b-instruct", "qwen3-32b"),
        ("qwen3-vl-30b-a3b-instruct", "qwen3-30b-a3b"),
        ("qwen3-vl-235b-a22b-instruct", "qwen3-235b-a22b"),
    ],
)
def test_qwen3_vl_language_models_are_the_qwen3_ones(name, sibling):
    vl, lm = specs.model(name), specs.model(sibling)
    assert vl.params - vl.vision_params == lm.params
    assert vl.active_params - vl.vision_params == lm.active_params


@pytest.mark.parametrize(
    ("name", "published", "without"),
    [
        # vendor "active" counts: OpenAI leaves out the input embedding table, GLM both tables
        ("gpt-oss-20b", 3.61, "input"),
        ("gpt-oss-120b", 5.13, "input"),
        ("glm-4.5-air", 12.0, "both"),
        ("glm-4.5", 32.0, "both"),
    ],
)
def test_active_counts_as_their_vendors_count_them(name, published, without):
    m = specs.model(name)
    tables = m.vocab * m.hidden * (1 if without == "input" else 2)
    assert (m.active_params - tables) / 1e9 == pytest.approx(published, rel=0.03)


@pytest.mark.parametrize(
    ("name", "nominal"),
    [("qwen3-vl-30b-a3b-instruct", 3), ("qwen3.5-35b-a3b", 3), ("qwen3.5-397b-a17b", 17)],
)
def test_active_counts_round_to_the_name(name, nominal):
    # "A3B" / "A17B" round the language model's active count (the tower is not in the name)
    m = specs.model(name)
    assert (m.active_params - m.vision_params) / 1e9 == pytest.approx(nominal, rel=0.2)


def test_hybrid_and_vision_fields_of_the_qwen35_family():
    for name in ("qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b"):
        m = specs.model(name)
        assert m.linear_attn.full_attention_interval == 4 and m.gated_attention
        assert m.mtp_layers == 1 and m.vision.image_tokens == 0  # text RL unless stated
    moe = specs.model("qwen3.5-397b-a17b")
    assert (moe.moe.experts, moe.moe.top_k, moe.moe.shared_experts) == (512, 10, 1)
    assert moe.full_attn_layers == 15 and moe.linear_layers == 45


NEW_GPUS = {
    "L20": "l20",
    "L40S": "l40s",
    "A100-PCIe": "a100-pcie",
    "H100-PCIe": "h100-pcie",
    "H100 NVL": "h100-nvl",
    "MI325X": "mi325x",
    "MI355X": "mi355x",
    "B300": "b300",
    "GB300": "gb300",
    "RTX 4090": "rtx-4090",
}


@pytest.mark.parametrize("written", sorted(NEW_GPUS))
def test_new_gpus_resolve_and_have_a_cluster(written):
    from rpeg.perf.validation.row_cells import cluster_for

    name = gpu_name({"gpu": written})
    assert name == NEW_GPUS[written] and name in specs.gpus()
    assert specs.cluster(cluster_for(name, None)).gpu.name == name
    assert not unknown_names({"model": "Qwen3-VL-8B-Instruct", "gpu": written})


def test_new_gpu_peaks_are_dense_figures():
    g = specs.gpus()
    assert g["b300"].bf16_dense_tflops == g["b200"].bf16_dense_tflops  # same compute per GPU
    assert g["gb300"].bf16_dense_tflops == g["gb200"].bf16_dense_tflops
    assert g["mi325x"].bf16_dense_tflops == g["mi300x"].bf16_dense_tflops  # same die
    for name in NEW_GPUS.values():
        spec = g[name]
        assert spec.fp8_dense_tflops is None or spec.fp8_dense_tflops >= spec.bf16_dense_tflops


def test_a_new_model_prices_on_a_new_gpu():
    from rpeg.ir import builders
    from rpeg.perf import Workload, predict
    from rpeg.perf.calibration import SHIPPED
    from rpeg.plan import colocated_plan

    g = builders.build("grpo", use_reference=False)
    wl = Workload(
        num_prompts=8,
        samples_per_prompt=4,
        mean_prompt_tokens=200,
        max_response_tokens=1024,
        mean_response_tokens=400,
        train_minibatches=1,
    )
    for model, cluster in (("qwen3-vl-8b-instruct", "l40s-cluster"), ("gpt-oss-20b", "dgx-b300")):
        plan = colocated_plan(g, cluster, num_nodes=1, model=model)
        pred = predict(g, plan, wl, calib=SHIPPED, check_memory=False)
        assert pred.step_s > 0
