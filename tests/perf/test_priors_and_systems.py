"""Nothing refused that a prior can answer; the system as an input of `rpeg predict`; MoE
training without EP on FSDP priced as a per-expert loop."""

import json

import pytest

from rpeg.cli import main
from rpeg.ir import builders
from rpeg.perf import Workload, predict
from rpeg.perf.calibration import SHIPPED
from rpeg.perf.lengths import prior_mean
from rpeg.perf.validation.published import read_rows, validate_rows
from rpeg.perf.validation.rows import PRIORS, read_case
from rpeg.plan import colocated_plan

ROWS = {r["case_id"]: r for r in read_rows()}
BASE = ROWS["nemo-v0.5-h100bf16-q32-grpo-on-32g"]  # reasoning model, 4,096 cap and budget


def test_blank_max_gen_len_takes_the_length_budget_and_is_listed_as_assumed():
    r = dict(BASE, max_gen_len="", avg_gen_len="")
    case = read_case(r)
    prompt = float(r["avg_prompt_len"])
    assert case.workload.max_response_tokens == int(float(r["max_seq_len"]) - prompt)
    assert "max_gen_len" in case.unknown
    (res,) = validate_rows([r]).rows
    assert res.prediction is not None, res.reason


def test_blank_max_gen_len_and_budget_take_the_prior_of_the_models_kind():
    r = dict(BASE, max_gen_len="", max_seq_len="", avg_gen_len="")
    case = read_case(r)
    assert case.workload.max_response_tokens == PRIORS["max_gen_len"]["reasoning"] == 32768
    r_base = dict(r, model_kind="base")
    assert read_case(r_base).workload.max_response_tokens == 4096


def test_a_mean_past_a_stated_cap_is_named():
    # BASE states max_gen_len 4,096, max_seq_len 4,096 and its prompt: each bounds the mean
    for cells, named in (
        ({"avg_gen_len": "5000"}, "exceeds max_gen_len=4096"),
        ({"avg_gen_len": "3000", "gen_cap": "2048"}, "exceeds gen_cap=2048"),
        ({"avg_gen_len": "4090", "max_gen_len": ""}, "exceeds max_seq_len - avg_prompt_len"),
    ):
        (res,) = validate_rows([dict(BASE, **cells)]).rows
        assert res.prediction is None and named in res.reason, (cells, res.reason)


def test_a_mean_past_a_prior_cap_moves_the_prior_not_the_mean():
    # no cap, no budget: the kind's budget (4,096 for an instruct model) gives way to a
    # published 6,000-token mean instead of clamping every response at 4,096
    r = dict(BASE, max_gen_len="", max_seq_len="", avg_gen_len="6000", model_kind="instruct")
    wl = read_case(r).workload
    assert wl.mean_response_tokens == 6000
    assert wl.max_response_tokens >= max(PRIORS["max_gen_len"].values())
    # ... but never past a gen_cap the row states
    assert read_case(dict(r, gen_cap="8000")).workload.max_response_tokens == 8000
    # a budget with the prompt unpublished: the prompt prior shrinks to the room left
    r = dict(BASE, max_gen_len="", avg_prompt_len="", avg_gen_len="4000")
    wl = read_case(r).workload
    assert wl.mean_prompt_tokens == pytest.approx(4096 - 4000)
    assert wl.max_response_tokens == 4000
    (res,) = validate_rows([r]).rows
    assert res.prediction is not None, res.reason


def test_model_kind_column_picks_the_length_prior():
    r = dict(BASE, avg_gen_len="", model_kind="base")
    case = read_case(r)
    assert case.workload.response_kind == "base"
    g = case.graph
    from rpeg.perf.validation.solve import solve_layout

    lay, pred = solve_layout(case, SHIPPED)
    cap = case.workload.max_response_tokens
    want = prior_mean("base", cap, SHIPPED)
    assert any(f"assumed {want:.0f} tokens (prior of base models" in a for a in pred.assumptions)
    assert g is not None


def test_blank_precision_is_bf16_and_assumed():
    case = read_case(dict(BASE, precision=""))
    assert case.workload.precision == "bf16" and "precision" in case.unknown


def test_an_unknown_model_is_the_only_refusal_and_names_the_fix():
    (res,) = validate_rows([dict(BASE, model="qwen9-moe", max_gen_len="")]).rows
    assert res.prediction is None and "rpeg specs add-model --from-hf" in res.reason


def test_fsdp_moe_without_ep_pays_a_loop_over_the_experts():
    from rpeg import specs

    m = specs.model("qwen3-30b-a3b")
    g = builders.build("grpo", use_reference=False)
    wl = Workload(
        num_prompts=8,
        samples_per_prompt=4,
        mean_prompt_tokens=128,
        max_response_tokens=1024,
        mean_response_tokens=512,
        train_minibatches=1,
    )
    base = colocated_plan(g, "dgx-h100", num_nodes=1, model="qwen3-30b-a3b", gen_tp=2)

    def with_engine(engine):
        units = {
            n: (u if u.engine == "vllm" else u.model_copy(update={"engine": engine}))
            for n, u in base.units.items()
        }
        return base.model_copy(update={"units": units})

    fsdp = with_engine("fsdp")
    p = predict(g, fsdp, wl, calib=SHIPPED, check_memory=False)
    tr = p.stages["train_actor"]
    passes = 4.0 if fsdp.units["train_actor"].recompute else 3.0
    micro = tr.detail["micro_batches"]
    want = micro * passes * SHIPPED.moe_expert_loop_s * m.moe.experts * m.moe_layers
    assert tr.detail["moe_expert_loop_s"] == pytest.approx(want, rel=1e-6)
    # 128 experts x 48 MoE layers x 0.1 ms = 0.61 s per micro-batch and pass
    assert m.moe.experts * m.moe_layers * SHIPPED.moe_expert_loop_s == pytest.approx(0.6144)
    mega = with_engine("megatron")
    q = predict(g, mega, wl, calib=SHIPPED, check_memory=False)
    assert "moe_expert_loop_s" not in q.stages["train_actor"].detail


def _plan_files(tmp_path):
    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "dgx-h100", num_nodes=1, model="llama3.1-8b", builder="grpo")
    (tmp_path / "plan.yaml").write_text(plan.to_yaml())
    (tmp_path / "run.yaml").write_text(
        "workload: {num_prompts: 32, samples_per_prompt: 8, max_prompt_tokens: 256, "
        "max_response_tokens: 2048, mean_response_tokens: 800, precision: bf16}\n"
    )
    return [str(tmp_path / "plan.yaml"), "--config", str(tmp_path / "run.yaml")]


def test_predict_takes_the_executing_system(tmp_path, capsys):
    from rpeg.perf.systems import system_params

    args = _plan_files(tmp_path)
    assert main(["predict", *args, "--json", "--system", "verl-fsdp"]) == 0
    verl = json.loads(capsys.readouterr().out)
    assert main(["predict", *args, "--json", "--system", "some-new-framework"]) == 0
    unknown = json.loads(capsys.readouterr().out)
    assert verl["system"] == "verl-fsdp"
    # an unknown system: the pooled factors, a range at least the pooled spread x 1.5
    pooled = system_params("some-new-framework")
    import math

    assert unknown["predicted_high_s"] >= unknown["step_s"] * math.exp(pooled.resid_hi) * 0.999
    assert main(["predict", *args]) == 0
    out = capsys.readouterr().out
    assert "system=rpeg" in out and "range" in out and "%/+" in out


@pytest.mark.parametrize(
    ("written", "catalog", "kind"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", None),
        ("Qwen3-30B-A3B-Base", "qwen3-30b-a3b", "base"),
        ("Qwen3-4B-Thinking-2507", "qwen3-4b", "reasoning"),
        ("meta-llama/Llama-3.1-8B", "llama3.1-8b", None),
        ("Qwen2.5-1.5B", "qwen2.5-1.5b-instruct", "base"),
        ("llama9-max", "llama9-max", None),  # no size in the name: no stand-in
    ],
)
def test_model_names_resolve_to_the_catalog_with_the_checkpoints_kind(written, catalog, kind):
    from rpeg.perf.validation.row_cells import resolve_model

    assert resolve_model(written) == (catalog, kind)


def test_a_base_checkpoint_named_in_the_row_takes_the_base_length_prior():
    r = dict(BASE, model="Qwen3-32B-Base", avg_gen_len="")
    case = read_case(r)
    assert case.model.name == "qwen3-32b" and case.workload.response_kind == "base"


def test_a_stated_micro_batch_budget_sets_the_trainers_micro_batches():
    def train_unit(**cells):
        case = read_case(dict(BASE, **cells))
        (res,) = validate_rows([dict(BASE, **cells)]).rows
        assert res.prediction is not None, res.reason
        lay = case.layout
        return case.plan(lay).units["train_actor"], res.prediction.stages["train_actor"].time_s

    blank, t_blank = train_unit()
    assert blank.micro_batch_size == 1  # silent: one max-length (4,096-token) sequence
    # verl's ppo_max_token_len_per_gpu as a multiple of the sequence budget, or in tokens
    double, t_double = train_unit(micro_batch_tokens="2x")
    assert double.micro_batch_size == 2 and t_double < t_blank  # half the per-micro-batch costs
    assert train_unit(micro_batch_tokens="12288")[0].micro_batch_size == 3  # 3 x 4,096
    assert train_unit(micro_batch_tokens="3000")[0].micro_batch_size == 1  # under one sequence
    # a per-GPU budget over a context-parallel group holds cp times its tokens (verl scales
    # ppo_max_token_len_per_gpu by its sequence-parallel size)
    case = read_case(dict(BASE, micro_batch_tokens="2x", train_cp="2", num_gpus="32"))
    assert case.budgets_per_micro_batch(case.layout.train_cp) == 4
    assert read_case(dict(BASE, train_cp="2")).budgets_per_micro_batch(2) == 1  # silent: one
    for bad in ("0.5x", "-4", "lots"):
        (res,) = validate_rows([dict(BASE, micro_batch_tokens=bad)]).rows
        assert res.prediction is None and "micro_batch_tokens=" in res.reason, bad
