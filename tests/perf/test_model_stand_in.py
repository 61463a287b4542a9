"""A published row whose model the catalog lacks but whose name states its size is priced by
a stand-in architecture (rpeg.perf.validation.stand_in): the nearest cataloged
architecture, its depth (and an MoE's expert count) set to the named size; listed among the
row's priors, its range widened by the architecture's spread. A name stating no size, or an
MoE without its total, stays refused with the command that adds the model."""

import math

import pytest

from rpeg import specs
from rpeg.perf.interval import ARCH_FACTOR, Unknowns, predict_interval
from rpeg.perf.validation import loso
from rpeg.perf.validation.row_cells import resolve_model, unknown_names
from rpeg.perf.validation.rows import assumed_values, read_case
from rpeg.perf.validation.solve import solve_row
from rpeg.perf.validation.stand_in import stand_in, stated_kind

ROW = {
    "case_id": "u-1",
    "source": "user",
    "algorithm": "grpo",
    "gpu": "H100",
    "num_gpus": "16",
    "gpus_per_node": "8",
    "num_prompts": "64",
    "samples_per_prompt": "8",
    "max_gen_len": "4096",
    "avg_gen_len": "1500",
    "measured_step_s": "200",
}


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("facebook/OPT-6.7B", 6.7),
        ("acme-lm-13b", 13.0),
        ("Foo-70B-Chat", 70.0),
        ("x-350m", 0.35),
        ("Acme-1.2T", 1200.0),
        ("bigscience/bloom-7b1", 7.1),  # BLOOM's spelling: the digit after the unit a decimal
        ("bloomz-1b7", 1.7),
    ],
)
def test_a_dense_name_is_priced_at_its_stated_size(name, billions):
    spec = stand_in(name)
    assert spec is not None and spec.moe is None
    # one layer of the stand-in's is the only rounding: within 5% of the stated size
    assert spec.params == pytest.approx(billions * 1e9, rel=0.05)
    base = spec.name.split(" (as ")[1].rstrip(")")
    assert base in specs.models() and spec.hidden == specs.model(base).hidden


@pytest.mark.parametrize(
    ("name", "total", "active"), [("Acme-100B-A10B", 100e9, 10e9), ("Acme-1T-A32B", 1e12, 32e9)]
)
def test_an_moe_name_matches_active_and_total(name, total, active):
    spec = stand_in(name)
    assert spec is not None and spec.moe is not None
    assert spec.active_params == pytest.approx(active, rel=0.08)
    assert spec.params == pytest.approx(total, rel=0.08)
    assert spec.moe.experts % 8 == 0 and spec.moe.experts >= spec.moe.top_k


def test_a_family_name_stays_in_its_family_and_a_current_attention():
    spec = stand_in("Qwen2.5-Foo-14B")
    assert spec.name.split(" (as ")[1].startswith("qwen2.5")
    # no family: grouped-query (or latent) attention, not the multi-head of old models
    other = stand_in("nobody-30b")
    assert other.kv_heads < other.heads or other.mla is not None


def test_a_vision_language_name_takes_a_vision_tower():
    assert stand_in("Acme-VL-7B").vision is not None
    assert stand_in("Acme-7B").vision is None
    for name in ("SmolVLM-2B", "Idefics3-8B", "Ovis2-8B", "GLM-4.1V-9B-Thinking", "Acme-R1V-38B",
                 "Acme-Omni-7B", "DeepSeek-VL2-27B", "Acme-V-8B"):  # fmt: skip
        assert stand_in(name).vision is not None, name
    # version words are not vision words
    for name in ("Acme-7B-Instruct-v0.3", "Acme-V3-30B", "Acme-7B-v1"):
        assert stand_in(name).vision is None, name


def test_a_vl_checkpoint_holding_a_text_models_name_keeps_its_vision_tower():
    from rpeg import specs
    from rpeg.perf.validation.row_cells import resolve_model

    # LLaVA-1.6 is Mistral-7B's LM with a vision tower: the text entry inside its name would
    # drop the tower, so a VL stand-in prices it
    name, _ = resolve_model("llava-v1.6-mistral-7b")
    assert name.startswith("llava-v1.6-mistral-7b (as ")
    assert specs.model(name).vision is not None
    # a VL fine-tune of a cataloged VL model keeps that entry, not a stand-in
    assert resolve_model("Qwen2.5-VL-7B-Instruct-GRPO-geo3k")[0] == "qwen2.5-vl-7b-instruct"
    # a text fine-tune holding a cataloged name keeps that entry
    assert resolve_model("OpenRLHF/Llama-3-8b-sft-mixture") == ("llama3-8b", None)
    assert resolve_model("Mistral-7B-Instruct-v0.3")[0] == "mistral-7b"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Acme-7B-Base", "base"),
        ("Acme-7B-Instruct", "instruct"),
        ("Acme-R1-7B", "reasoning"),
        ("acme-7b-it", "instruct"),
        ("Acme-Thinking-7B", "reasoning"),
        ("Acme-7B", None),
    ],
)
def test_the_kind_is_what_the_name_says(name, kind):
    assert stated_kind(name) == kind
    assert resolve_model(name)[1] == kind
    assert stand_in(name).kind == (kind or "instruct")


@pytest.mark.parametrize(
    "name", ["Acme-8x22B", "Acme-17B-16E-Instruct", "acme-lm", "a-7b-13b", "acme-6.7b1"]
)
def test_no_stated_size_or_an_moe_without_its_total_stays_refused(name):
    assert stand_in(name) is None
    assert "rpeg specs add-model --from-hf" in unknown_names({"model": name, "gpu": "H100"})


def test_a_stand_in_row_is_priced_listed_and_wider():
    real = read_case({**ROW, "model": "Qwen/Qwen2.5-7B-Instruct"})
    case = read_case({**ROW, "model": "Acme-7B-Instruct"})
    assert "model" in case.unknown and "model" not in real.unknown
    got = dict(a.split("=", 1) for a in assumed_values(case))
    assert got["model"] == case.model.name and " (as " in got["model"]
    case, lay, pred = solve_row(case)
    plan = case.plan(lay)
    lo, hi = predict_interval(case.graph, plan, case.workload, point=pred.step_s)
    lo2, hi2 = predict_interval(
        case.graph, plan, case.workload, unknown=Unknowns.of(["model"]), point=pred.step_s
    )
    # the architecture input adds (ARCH_FACTOR - 1) x point in quadrature above
    up = math.hypot(hi - pred.step_s, (ARCH_FACTOR - 1) * pred.step_s)
    assert hi2 == pytest.approx(pred.step_s + up, rel=1e-9) and lo2 < lo


def test_a_validated_file_predicts_the_stand_in_row():
    priced, refused = loso.price_rows([{**ROW, "model": "Acme-7B-Instruct"}], "mine")
    assert not refused and len(priced) == 1


def test_a_catalog_entry_is_never_shadowed_by_a_stand_in():
    stand_in("qwen2.5-7b")  # a stand-in built for a name the catalog holds is not registered
    assert resolve_model("Qwen2.5-7B") == ("qwen2.5-7b", None)
    assert specs.model("qwen2.5-7b") == specs.models()["qwen2.5-7b"]


def test_a_given_catalog_is_the_only_choice():
    # benchmarks/bench_stand_in.py prices each row with a catalog lacking its own shape
    only = {"llama3.1-70b": specs.model("llama3.1-70b")}
    spec = stand_in("Acme-8B", catalog=only)
    assert spec.name == "acme-8b (as llama3.1-70b)" and spec.hidden == 8192
    assert spec.params == pytest.approx(8e9, rel=0.15)  # 8B in whole 70B-wide layers
    assert stand_in("Acme-30B-A3B", catalog=only) is None  # no MoE to stand in
