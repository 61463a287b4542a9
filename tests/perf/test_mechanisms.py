"""What a row's prediction rests on, and ranges widened for what no other source checks
(rpeg.perf.validation.mechanisms): a mechanism only the scored source uses widens its LOSO range
by MECHANISM_FACTOR either way, in quadrature; one another source's measured run uses does not."""

import math
from dataclasses import replace

import numpy as np
import pytest

from rpeg.perf.validation import loso, mechanisms
from rpeg.perf.validation.loso import GRID, Priced
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_row
from tests.perf.schema_rows import schema_row


def _priced(case, source, mech, measured=20.0):
    grid = np.array([[[10.0 / g + 10.0 / t for t in GRID] for g in GRID]])
    return Priced(
        case_id=case,
        source=source,
        system="",
        dataset="synthetic",
        measured_s=measured,
        measured_tput=None,
        step=grid,
        tokens_per_step=np.array([1e6]),
        stage_pred={},
        stage_meas={},
        unknown_lo=0.0,
        unknown_hi=0.0,
        mechanisms=mech,
    )


def _fleet():
    # nine rows in three sources, measured around their modelled 20 s (a residual spread)
    return [
        _priced(f"r{i}", f"s{i % 3}", ("gpu h100-sxm",), 20.0 * (1 + 0.04 * (i - 4)))
        for i in range(9)
    ]


def test_a_mechanism_only_the_scored_source_uses_is_unchecked():
    rows = [*_fleet(), _priced("a", "new", ("gpu h100-sxm", "ppo critic"))]
    got = mechanisms.unchecked(rows)
    assert got["a"] == ("ppo critic",)
    assert all(got[f"r{i}"] == () for i in range(9))  # the other sources check each other's gpu
    # one source alone does not check itself, however many rows it has
    solo = [_priced(f"x{i}", "only", ("gpu a800",)) for i in range(4)]
    assert all(v == ("gpu a800",) for v in mechanisms.unchecked(solo).values())
    # a row with no step time checks nothing
    tput = replace(_priced("t", "other", ("ppo critic",)), measured_s=None)
    assert mechanisms.unchecked([*rows, tput])["a"] == ("ppo critic",)
    step = _priced("u", "other", ("ppo critic",))
    assert mechanisms.unchecked([*rows, step])["a"] == ()


def test_an_unchecked_mechanism_widens_the_loso_range_in_quadrature():
    plain = {s.case_id: s for s in loso.score([*_fleet(), _priced("a", "new", ("gpu h100-sxm",))])}
    wide = {
        s.case_id: s
        for s in loso.score([*_fleet(), _priced("a", "new", ("gpu h100-sxm", "ppo critic"))])
    }
    p, w = plain["a"], wide["a"]
    assert w.unchecked == ("ppo critic",) and p.unchecked == ()
    assert w.pred_loso == pytest.approx(p.pred_loso)  # the point does not move
    h0 = math.log(p.hi_loso / p.pred_loso)
    h1 = math.log(w.hi_loso / w.pred_loso)
    assert h1**2 - h0**2 == pytest.approx(math.log(mechanisms.MECHANISM_FACTOR) ** 2, rel=1e-6)
    lo0, lo1 = math.log(p.pred_loso / p.lo_loso), math.log(w.pred_loso / w.lo_loso)
    assert lo1**2 - lo0**2 == pytest.approx(math.log(mechanisms.MECHANISM_FACTOR) ** 2, rel=1e-6)
    # in-sample the row is in the fit: it checks its own mechanisms
    assert (w.lo_in, w.hi_in) == pytest.approx((p.lo_in, p.hi_in))
    # two unchecked mechanisms: two independent terms
    two = {
        s.case_id: s
        for s in loso.score(
            [*_fleet(), _priced("a", "new", ("gpu h100-sxm", "ppo critic", "vision tower"))]
        )
    }["a"]
    h2 = math.log(two.hi_loso / two.pred_loso)
    assert h2**2 - h0**2 == pytest.approx(2 * math.log(mechanisms.MECHANISM_FACTOR) ** 2)


def _case(**cells):
    r = schema_row(
        dict(
            case_id="syn", source="synthetic", measured_step_s="100", gpus_per_node="8",
            model="meta-llama/Llama-2-7b-hf", gpu="A800", num_gpus="16", placement="colocated",
            algorithm="ppo", has_critic="yes", has_ref="yes", num_prompts="256",
            samples_per_prompt="1", max_gen_len="512", avg_gen_len="400",
            train_backend="deepspeed",
        ),
        **cells,
    )  # fmt: skip
    case, lay, _ = solve_row(read_case(r))
    return mechanisms.of(case, lay.solved)


def test_a_row_names_what_its_prediction_rests_on():
    ds_chat = _case(system="deepspeed-chat", zero_stage="2")
    assert {
        "gpu a800",
        "trainer zero-1/2",
        "ppo critic",
        "learned reward model",
        "static-batch generation",
    } <= set(ds_chat)
    grpo = _case(
        algorithm="grpo", has_critic="no", gpu="H100", model="Qwen/Qwen3-30B-A3B",
        train_backend="megatron", num_gpus="32",
    )  # fmt: skip
    assert set(grpo) == {"gpu h100-sxm", "trainer megatron", "mixture of experts"}
    vl = _case(algorithm="grpo", has_critic="no", model="Qwen/Qwen2.5-VL-7B-Instruct")
    assert "vision tower" in vl
    assert "vision tower" not in _case(
        algorithm="grpo", has_critic="no", model="Qwen/Qwen2.5-VL-7B-Instruct", image_tokens="0"
    )
    # NeMo-Aligner's critic server on nodes of its own; SGLang's running cap under drafts
    aligner = _case(system="nemo-aligner", num_gpus="24", train_backend="megatron")
    assert "critic on a pool of its own" in aligner
    assert "critic on a pool of its own" not in _case(
        system="nemo-aligner", num_gpus="24", train_backend="megatron", critic_gpus="0"
    )
    slime = _case(
        algorithm="grpo", has_critic="no", system="slime", train_backend="megatron",
        notes="SGLang EAGLE speculative_num_steps=3",
    )  # fmt: skip
    assert {"speculative decoding", "engine running-request cap"} <= set(slime)


@pytest.mark.slow
def test_the_shipped_rows_name_their_unchecked_mechanisms():
    scored, _ = loso.run()
    by_id = {s.case_id: s for s in scored}
    # the only GH200 run (verl issue #1208): no other source measured a GH200
    gh = by_id["verl-issue1208-qwen2.5-0.5b-gh200"]
    assert "gpu gh200" in gh.unchecked
    # NeMo-RL's H100 rows are checked by the other NeMo-RL releases and verl's runs
    nemo = [s for s in scored if s.source.startswith("NeMo-RL") and "h100" in s.case_id]
    assert nemo and all("gpu h100-sxm" not in s.unchecked for s in nemo)
