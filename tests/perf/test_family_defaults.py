"""What a system family does by default, priced where a row (or its text) says it: generation
without continuous batching (DeepSpeed-Chat's hybrid engine) and the ZeRO stage of a DeepSpeed
trainer."""

import pytest

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows
from rpeg.perf.validation.row_cells import Unpredictable
from rpeg.perf.validation.row_text import with_text
from rpeg.perf.validation.rows import STATIC_GEN_BATCH, read_case
from rpeg.perf.validation.solve import solve_row

BASE = "nemo-v0.5-h100bf16-llama-grpo-on-16g"  # Llama-3.1-8B, 16 H100, 64 x 32 samples


def _row(**cells):
    for r in read_rows(loso.default_datasets()["steps_dev"]):
        if r["case_id"] == BASE:
            return {**r, **{k: str(v) for k, v in cells.items()}}
    raise KeyError(BASE)


def _gen(**cells):
    case, lay, pred = solve_row(read_case(_row(**cells)), SHIPPED)
    g = pred.stages["generate"]
    return g.time_s - g.detail["prefill_s"], g


def test_static_batches_decode_each_batch_to_its_longest_response():
    cont, _ = _gen(gpu_memory_utilization=0.6)
    static, g = _gen(gpu_memory_utilization=0.6, gen_batching="static", gen_batch_size=8)
    assert static > 2 * cont  # 8 sequences at a time instead of hundreds
    # twice the prompts: twice the batches, each as long
    double, g2 = _gen(
        gpu_memory_utilization=0.6, gen_batching="static", gen_batch_size=8, num_prompts=128
    )
    assert g2.detail["static_batches"] == 2 * g.detail["static_batches"]
    assert double == pytest.approx(2 * static, rel=0.02)
    # a batch runs to the longest of its 8 responses: longer than the mean
    assert g.detail["longest_response"] > read_case(_row()).workload.mean_response_tokens


def test_deepspeed_chat_hybrid_engine_in_the_text_means_static_batches():
    notes = "DeepSpeed-Chat step 3 (RLHF) with the hybrid engine; ZeRO-3 actor"
    r = with_text(_row(notes=notes, train_backend="deepspeed"))
    assert r["gen_batching"] == "static" and r["zero_stage"] == "3"
    case = read_case(r)
    assert case.workload.gen_static_batch == STATIC_GEN_BATCH
    assert "gen_batch_size" in case.unknown


def test_zero_stage_two_keeps_weights_whole_and_gathers_nothing():
    cells = dict(train_backend="deepspeed", train_tp=1, train_pp=1, gpu_memory_utilization=0.6)
    z3 = solve_row(read_case(_row(zero_stage=3, **cells)), SHIPPED)[2]
    z2 = solve_row(read_case(_row(zero_stage=2, **cells)), SHIPPED)[2]
    w3 = z3.stages["train_actor"].memory_gb["weights"]
    w2 = z2.stages["train_actor"].memory_gb["weights"]
    assert w2 == pytest.approx(16 * w3)  # replicated vs sharded over 16 ranks
    assert z2.stages["train_actor"].time_s < z3.stages["train_actor"].time_s


def test_bad_family_cells_are_refused_with_the_allowed_values():
    with pytest.raises(Unpredictable, match="zero_stage=4; allowed: 0, 1, 2, 3"):
        read_case(_row(zero_stage=4))
    with pytest.raises(Unpredictable, match="gen_batching='paged'; allowed: continuous, static"):
        read_case(_row(gen_batching="paged"))
