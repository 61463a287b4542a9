"""The task a row's prompts pose (code or math), read from its text where it is unambiguous,
and the longer response-length prior of a reasoning model on code (rpeg.perf.lengths,
``Calibration.response_scale_code``; docs/perf-model.md, "Response-length prior")."""

import math
import random

import pytest

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.lengths import prior_mean
from rpeg.perf.validation.loso import default_datasets
from rpeg.perf.validation.published import read_rows, validate_rows
from rpeg.perf.validation.row_cells import Unpredictable
from rpeg.perf.validation.row_text import read, with_text
from rpeg.perf.validation.rows import assumed_values, read_case

ROWS = {r["case_id"]: r for p in default_datasets().values() for r in read_rows(p)}
#: a reasoning model (R1-Distill-Qwen-14B) whose mean response length is unpublished
CODE_ROW = ROWS["areal-t1-14b-areal"]


def _domain(notes: str) -> str:
    return read({"notes": notes}).get("task_domain", "")


def test_a_code_benchmark_or_data_set_in_the_text_reads_as_code():
    assert _domain("code RL (DeepCoder data, LiveCodeBench eval)") == "code"
    assert _domain("evaluated on LiveCodeBench v5") == "code"
    assert _domain("Codeforces problems, competitive programming") == "code"
    assert _domain("math (DeepScaleR data, AIME24 eval)") == "math"
    assert _domain("DAPO-Math-17k prompts") == "math"


def test_an_ambiguous_or_incidental_mention_leaves_the_domain_blank():
    # both domains named: a mixed or compared run says nothing of this one
    assert _domain("DeepScaleR data and LiveCodeBench eval") == ""
    # bare words and names that are models or recipes, not the data the run trains on
    assert _domain("throughput measured with the latest verl code") == ""
    assert _domain("Qwen2.5-Math-7B, a math model") == ""
    assert _domain("DeepScaleR's verl recipe used a KL loss") == ""
    assert _domain("E1-Code-14B is based on DeepCoder-14B-Preview") == ""


def test_a_stated_domain_cell_is_kept_and_an_unknown_one_refused():
    r = dict(CODE_ROW, task_domain="math")
    assert with_text(r)["task_domain"] == "math"
    assert read_case(r).workload.task_domain == "math"
    with pytest.raises(Unpredictable, match="task_domain"):
        read_case(dict(CODE_ROW, task_domain="poetry"))


def test_the_shipped_code_rows_read_code_from_their_notes():
    # AReaL Table 1's 14B/32B runs train on DeepCoder's problems and evaluate on
    # LiveCodeBench; its 1.5B/7B runs on DeepScaleR's math (the notes' last clause)
    domain = {c: with_text(r).get("task_domain", "") for c, r in ROWS.items()}
    code = {c for c, d in domain.items() if d == "code"}
    assert code == {c for c, r in ROWS.items() if "| code (" in r["notes"]}
    assert len(code) >= 4
    assert all(domain[c] == "math" for c, r in ROWS.items() if "| math (" in r["notes"])


def test_code_scales_the_reasoning_median_and_nothing_else():
    cap = 27648
    base, code = (
        prior_mean("reasoning", cap, SHIPPED),
        prior_mean("reasoning", cap, SHIPPED, domain="code"),
    )
    assert SHIPPED.response_scale_code > 1.0 and code > base
    # the same rule as a scaled median: one lognormal, its median times the code scale
    assert code == pytest.approx(
        prior_mean("reasoning", cap, SHIPPED, scale=SHIPPED.response_scale_code)
    )
    # no published figure for instruct/base models on code: their prior is unchanged
    assert prior_mean("instruct", cap, SHIPPED, domain="code") == prior_mean(
        "instruct", cap, SHIPPED
    )
    assert prior_mean("reasoning", cap, SHIPPED, domain="math") == base


def test_the_code_prior_matches_a_monte_carlo_of_its_definition():
    rng = random.Random(1)
    median = SHIPPED.response_median_reasoning * SHIPPED.response_scale_code
    for cap in (8192, 27648):
        at = median * (cap / 4096) ** SHIPPED.reasoning_cap_exponent  # the budget's growth
        xs = [min(at * math.exp(rng.gauss(0, SHIPPED.length_sigma)), cap) for _ in range(40000)]
        assert prior_mean("reasoning", cap, SHIPPED, domain="code") == pytest.approx(
            sum(xs) / len(xs), rel=0.02
        )


def test_a_code_row_is_priced_at_the_code_prior_and_says_so():
    case = read_case(CODE_ROW)
    cap = case.workload.max_response_tokens
    want = prior_mean("reasoning", cap, SHIPPED, domain="code")
    assert f"avg_gen_len={want:.0f} (reasoning code prior)" in ",".join(
        f"{k}={v}" for k, v in _assumed(case).items()
    )
    (res,) = validate_rows([CODE_ROW]).rows
    assert res.prediction is not None, res.reason
    assert any(
        f"assumed {want:.0f} tokens (prior of reasoning models on code" in a
        for a in res.prediction.assumptions
    )
    # the same row without the text's domain: the plain reasoning prior, a shorter step
    plain = dict(
        CODE_ROW,
        notes=CODE_ROW["notes"]
        .replace("LiveCodeBench", "a")
        .replace("DeepCoder data", "some data"),
    )
    assert read_case(plain).workload.task_domain is None
    (res_plain,) = validate_rows([plain]).rows
    assert res_plain.prediction.step_s < res.prediction.step_s


def _assumed(case):
    out = {}
    for item in assumed_values(case, SHIPPED):
        k, _, v = item.partition("=")
        out[k] = v
    return out
