"""Model names as published runs write them resolve onto the catalog's architectures
(rpeg.perf.validation.row_cells.resolve_model), so a run on a known architecture is priced, not refused
as an unknown model: Meta's own checkpoint names, fine-tunes named after their base, and the
architectures issue 43's unseen runs used (Llama-3 8B/70B, Llama-3.1-405B, QwQ-32B, ...)."""

import pytest

from rpeg import specs
from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows
from rpeg.perf.validation.row_cells import resolve_model, unknown_names


@pytest.mark.parametrize(
    ("written", "catalog", "kind"),
    [
        ("Llama-3-8B", "llama3-8b", None),
        ("Meta-Llama-3-8B-Instruct", "llama3-8b", "instruct"),
        ("meta-llama/Meta-Llama-3-70B-Instruct", "llama3-70b", "instruct"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama3.1-70b", "instruct"),
        ("Llama-3.1-405B-Instruct", "llama3.1-405b", "instruct"),
        ("Qwen/QwQ-32B", "qwq-32b", None),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "deepseek-r1-distill-llama-70b", None),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b", "instruct"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", "nemotron-3-nano-30b-a3b", None),
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nemotron-3-nano-30b-a3b", None),
        # fine-tunes named after their base and size take its architecture, kind unsaid
        ("OpenRLHF/Llama-3-8b-sft-mixture", "llama3-8b", None),
        ("hkust-nlp/Qwen2.5-7B-SimpleRL-Zoo", "qwen2.5-7b", None),
        # a distilled checkpoint whose name holds its base's: that base, the kind its name says
        ("deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", "qwen3-8b", "reasoning"),
        ("SimpleRL-Zoo-Qwen2.5-Math-7B", "qwen2.5-math-7b", None),
        # quantized checkpoints are their architecture; footnote marks are not the name
        ("zai-org/GLM-4.5-Air-FP8", "glm-4.5-air", None),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "qwen3-235b-a22b", "instruct"),
        ("Qwen2.5-7B-Instruct-GPTQ-Int4", "qwen2.5-7b-instruct", None),
        ("Qwen3-32B-AWQ", "qwen3-32b", None),
        ("DeepSeek-R1-Distill-Qwen-7B*", "deepseek-r1-distill-qwen-7b", None),
        ("Llama-3-8B†", "llama3-8b", None),
        # names that resolved before resolve as before
        ("Qwen3-30B-A3B-Base", "qwen3-30b-a3b", "base"),
        ("Qwen3-4B-Instruct-2507", "qwen3-4b", "instruct"),
        ("Qwen2.5-Math-7B", "qwen2.5-math-7b", None),
    ],
)
def test_published_names_resolve(written, catalog, kind):
    assert resolve_model(written) == (catalog, kind)
    assert catalog in specs.models()


@pytest.mark.parametrize(
    "written",
    [
        "Qwen2.5-Omni-7B",  # not the qwen2.5-7b entry: no head of it is cataloged
        "some-lab/unknown-13b-model",
    ],
)
def test_a_name_no_cataloged_head_matches_is_not_a_catalog_entry(written):
    # priced by a stand-in of its stated size (tests/perf/test_model_stand_in.py), never
    # as a catalog entry of another checkpoint
    name, kind = resolve_model(written)
    assert name not in specs.models() and kind is None
    assert name.endswith(")") and " (as " in name


def test_a_name_without_a_size_stays_unknown():
    name, kind = resolve_model("some-lab/mystery-model")
    assert name not in specs.models() and kind is None
    assert "unknown model" in unknown_names({"model": "some-lab/mystery-model", "gpu": "H100"})


def test_llama3_shapes_are_the_llama31_ones():
    for old, new in (("llama3-8b", "llama3.1-8b"), ("llama3-70b", "llama3.1-70b")):
        a, b = specs.model(old), specs.model(new)
        assert (a.params, a.kv_bytes_per_token(2)) == (b.params, b.kv_bytes_per_token(2))
        assert a.max_position == 8192  # Llama 3: an 8K context


def test_nemotron_h_is_priced_in_the_hybrid_linear_form():
    # from its config.json: 52 layers = 23 Mamba-2 (64 heads x 64, state 128) + 23 MoE + 6 GQA
    # (32 q / 2 kv x 128); 31.6 B published
    m = specs.model("nemotron-3-nano-30b-a3b")
    assert not m.unsupported and m.kind == "reasoning"
    assert m.params / 1e9 == pytest.approx(31.6, rel=0.01)
    assert m.kv_bytes_per_token(2) == 6 * 2 * 2 * 128 * 2  # only the 6 GQA layers cache K/V
    la = m.linear_attn
    assert la.value_heads * la.key_head_dim * la.value_head_dim == 64 * 64 * 128
    assert (m.full_attn_layers, m.moe_layers) == (6, 23)


def _row(**cells):
    base = read_rows(loso.default_datasets()["steps_dev"])[0]
    r = {k: "" for k in base}
    r.update(case_id="syn", source="synthetic", measured_step_s="100", gpus_per_node="8")
    r.update({k: str(v) for k, v in cells.items()})
    return r


@pytest.mark.parametrize(
    "cells",
    [
        # a 405B PPO with critic and reference, described in the shared schema only
        dict(
            model="meta-llama/Llama-3.1-405B-Instruct", gpu="H100", num_gpus=256,
            placement="colocated", algorithm="ppo", has_critic="yes", has_ref="yes",
            num_prompts=64, samples_per_prompt=1, max_gen_len=1024, train_backend="megatron",
        ),
        # an OpenRLHF 70B PPO on 32 A800 (its checkpoint named after Llama-3-70B)
        dict(
            model="OpenRLHF/Llama-3-70b-sft", gpu="A800", num_gpus=32,
            placement="disaggregated", gen_gpus=8, train_gpus=24, algorithm="ppo",
            has_critic="yes", has_ref="yes", num_prompts=128, samples_per_prompt=1,
            max_gen_len=1024, train_backend="deepspeed",
        ),
        dict(
            model="Qwen/QwQ-32B", gpu="H800", num_gpus=64, placement="colocated",
            algorithm="grpo", num_prompts=64, samples_per_prompt=8, max_gen_len=16384,
        ),
        dict(
            model="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", gpu="H100", num_gpus=16,
            placement="colocated", algorithm="grpo", num_prompts=64, samples_per_prompt=16,
            max_gen_len=8192, train_backend="megatron",
        ),
    ],
)  # fmt: skip
def test_runs_on_these_architectures_are_priced_not_refused(cells):
    priced, refused = loso.price_rows([_row(**cells)], "synthetic")
    assert [r.reason for r in refused] == [] and len(priced) == 1
    assert priced[0].step.min() > 0
