"""Today's architectures from config.json, hand-worked per family: hybrid linear attention
(Gated DeltaNet + gated full attention every N layers), vision towers, MTP layers."""

import pytest

from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.perf.calibration import SHIPPED
from rpeg.plan import colocated_plan
from rpeg.specs.hf import entry_from_hf
from rpeg.specs.models import parse_models

HYBRID = {
    "model_type": "qwen3_next",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 100,
    "full_attention_interval": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
}


def _model(cfg):
    return parse_models([({"models": {"m": entry_from_hf(cfg)}}, "test")])["m"]


def test_hybrid_linear_attention_parameters_state_and_cache_by_hand():
    m = _model(HYBRID)
    assert (m.full_attn_layers, m.linear_layers) == (2, 2)
    assert m.gated_attention and m.mtp_layers == 1
    # full layer: q 64x64, k/v 2 x 64x32, o 64x64, output gate 64x64, q/k norms 2x16
    assert m.attn_params == 4096 + 4096 + 4096 + 4096 + 32
    # linear layer: qkvz 64x(2*16 + 2*32), ba 64x(2*4), conv (16+16+32)x4, A_log + dt_bias
    # 2x4, gated norm 8, out 32x64
    assert m.linear_attn_params == 6144 + 512 + 256 + 8 + 8 + 2048
    # + 4 SwiGLU MLPs 3x64x128, untied embeddings 2x100x64, norms 4x2x64 + 64
    assert m.params == 12800 + 2 * 16416 + 2 * 8976 + 4 * 24576 + 576
    # KV cache only on the 2 full layers: 2 x (2 kv heads x 16 x K,V) x 2 bytes
    assert m.kv_bytes_per_token(2.0) == 2 * 64 * 2
    # fixed state per sequence: 2 linear layers x (4 heads x 8 x 8 + conv (16+16+32) x 3) x 2 B
    assert m.linear_state_bytes(2.0) == 2 * (256 + 192) * 2
    # attention score FLOPs grow with context on the full layers only
    assert m.attn_flops_fwd(1000) == 2.0 * 2 * 1000 * (64 + 64)
    assert m.linear_flops_per_token == 2 * 6 * 4 * 8 * 8


def test_full_attention_interval_from_layer_types():
    cfg = dict(HYBRID, model_type="qwen3_5")
    del cfg["full_attention_interval"]
    cfg["layer_types"] = ["linear_attention", "full_attention"] * 2
    nested = {"model_type": "qwen3_5", "text_config": cfg}
    m = _model(nested)
    assert m.linear_attn.full_attention_interval == 2 and m.family == "qwen3.5"


def test_vision_tower_parameters_by_hand():
    cfg = {
        "model_type": "qwen2_5_vl",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "vision_config": {
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 32,
            "hidden_act": "silu",
            "patch_size": 2,
            "temporal_patch_size": 2,
            "in_chans": 3,
            "spatial_merge_size": 2,
            "out_hidden_size": 64,
        },
    }
    m = _model(cfg)
    # blocks: 2 x (4x16^2 + 4x16 biases + 3x16x32 SwiGLU + 4x16 norms); patch embedding
    # 3x2x2x2x16; merger (4x16)^2 + (4x16)x64
    assert m.vision.params == 2 * (1024 + 64 + 1536 + 64) + 384 + 4096 + 4096
    assert m.vision.patch_merge == 4
    text = _model({k: v for k, v in cfg.items() if k != "vision_config"})
    assert m.params - text.params == m.vision.params
    assert m.matmul_params == text.matmul_params  # the tower runs per patch, not per token


def test_vision_tower_costs_per_image_token_in_every_pass():
    # Qwen2.5-VL-7B and Qwen2.5-7B share the LM: with I image tokens per sample, the VL
    # model's training FLOPs = the text model's at prompt P + I plus the tower's
    # 2 x params x I x 4 patches per sample, times the passes
    g = builders.build("grpo", use_reference=False)
    img, n, p0 = 256.0, 8 * 4, 100.0

    def run(model, prompt, image):
        plan = colocated_plan(g, "dgx-h100", num_nodes=1, model=model)
        wl = Workload(
            num_prompts=8,
            samples_per_prompt=4,
            mean_prompt_tokens=prompt,
            max_response_tokens=512,
            mean_response_tokens=200,
            image_tokens=image,
            train_minibatches=1,
        )
        return predict(g, plan, wl, calib=SHIPPED, check_memory=False)

    vl = run("qwen2.5-vl-7b-instruct", p0, img)
    tx = run("qwen2.5-7b-instruct", p0 + img, None)
    from rpeg import specs

    pv = specs.model("qwen2.5-vl-7b-instruct").vision.params
    tower = 2.0 * pv * img * 4 * n
    recompute = (
        colocated_plan(g, "dgx-h100", num_nodes=1, model="qwen2.5-7b-instruct")
        .units["train_actor"]
        .recompute
    )
    passes = 4.0 if recompute else 3.0
    d = vl.stages["train_actor"].flops - tx.stages["train_actor"].flops
    assert d == pytest.approx(passes * tower, rel=1e-6)
    assert vl.step_s > tx.step_s


def test_qwen3_vl_vision_tower_by_hand_and_the_catalog_entry():
    """Qwen3-VL's tower (transformers modeling_qwen3_vl): Conv3d patch embedding with bias,
    learned position embedding, LayerNorm'd blocks with a biased fc1/fc2 MLP, the merger and
    one deepstack merger per listed layer. Small by hand, then Qwen3-VL-8B's config as
    published against the catalog's entry (which was counted independently, in its source)."""
    small = {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 100,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 32,
            "hidden_act": "gelu_pytorch_tanh",
            "patch_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "spatial_merge_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 9,
            "deepstack_visual_indexes": [0],
        },
    }
    m = _model(small)
    # blocks 2 x (4x16^2 + 4x16 attention biases + 2x16x32 + 32 + 16 MLP with biases + 4x16
    # norms); patch embedding 3x2x2x2x16 + 16 bias; positions 9x16; merger LayerNorm(16)
    # 2x16 + 64x64 + 64 + 64x64 + 64; one deepstack merger: LayerNorm(64) 2x64 + the same MLP
    mlp = 64 * 64 + 64 + 64 * 64 + 64
    want = 2 * (1024 + 64 + 1024 + 32 + 16 + 64) + 384 + 16 + 144 + (32 + mlp) + (128 + mlp)
    assert m.vision.params == want and m.vision.patch_merge == 4
    cfg8b = {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_size": 4096,
            "num_hidden_layers": 36,
            "intermediate_size": 12288,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "hidden_act": "gelu_pytorch_tanh",
            "patch_size": 16,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "spatial_merge_size": 2,
            "out_hidden_size": 4096,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24],
        },
    }
    from rpeg import specs

    assert _model(cfg8b).vision.params == specs.model("qwen3-vl-8b-instruct").vision.params
