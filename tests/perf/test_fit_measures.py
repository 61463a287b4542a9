"""A run that happened is never refused for memory while a measure its system would have
taken remains (rpeg.perf.validation.solve.solve_row): the trainer's optimizer on the host."""

from dataclasses import replace

import pytest

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.pricing import predict
from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_layout, solve_row
from rpeg.plan.schema import InfeasiblePlan


def _row(case_id):
    for path in loso.default_datasets().values():
        for r in read_rows(path):
            if r["case_id"] == case_id:
                return r
    raise KeyError(case_id)


def test_a_published_run_no_layout_fits_is_priced_with_the_optimizer_on_the_host():
    # verl's DeepSeek-671B on 96 H20: Megatron TP8 x PP12 leaves no data parallelism to
    # shard the optimizer over (its script offloads it to the CPU; the row does not say)
    case = read_case(_row("verl-dpsk671b-96g"))
    with pytest.raises(InfeasiblePlan) as exc:
        solve_layout(case, SHIPPED)
    assert exc.value.reason == "memory"
    priced, lay, pred = solve_row(case, SHIPPED)
    assert lay.solved["optimizer"] == "host"
    assert priced.workload.assumed_optimizer_on_host
    train = pred.stages["train_actor"]
    assert train.memory_gb["optimizer"] == 0.0
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 96.0
    assert any("optimizer assumed on the host" in a for a in pred.assumptions)
    # the host step costs time: the same plan with the optimizer on the device (memory
    # unchecked) trains faster
    on_device = predict(
        case.graph, case.plan(lay), case.workload, calib=SHIPPED, check_memory=False
    )
    assert train.time_s > on_device.stages["train_actor"].time_s


def test_a_run_that_fits_is_priced_as_described():
    case = read_case(_row("nemo-v0.5-h100bf16-llama-grpo-on-16g"))
    priced, lay, pred = solve_row(case, SHIPPED)
    assert priced is case and "optimizer" not in lay.solved
    assert pred.step_s == pytest.approx(solve_layout(case, SHIPPED)[1].step_s)
    assert pred.stages["train_actor"].memory_gb["optimizer"] > 0


def test_the_host_optimizer_time_grows_with_the_updates_per_step():
    case = read_case(_row("verl-dpsk671b-96g"))
    priced, lay, _ = solve_row(case, SHIPPED)
    plan = case.plan(lay)
    times = [
        predict(
            priced.graph,
            plan,
            replace(priced.workload, train_minibatches=k),
            calib=SHIPPED,
        )
        .stages["train_actor"]
        .detail["optimizer_s"]
        for k in (1, 2)
    ]
    assert times[1] == pytest.approx(2 * times[0]) and times[0] > 1.0


def _described(**cells):
    """A run described in the shared schema only (blank cells unknown)."""
    path = loso.shared_copies()["steps_dev (shared schema)"]
    with open(path) as fh:
        header = fh.readline().strip().split(",")
    return {**{k: "" for k in header}, **{k: str(v) for k, v in cells.items()}}


def test_a_trainer_with_no_stated_pipeline_takes_the_fewest_stages_that_fit():
    # DeepSeek-V3 GRPO on 64 H800 with a Megatron trainer and no layout stated:
    # weights + gradients alone are 2.7 TB, 42 GB a GPU only when split 64 ways
    row = _described(
        case_id="dsv3-64",
        source="a report",
        model="deepseek-v3",
        gpu="h800",
        num_gpus=64,
        gpus_per_node=8,
        placement="colocated",
        train_backend="megatron",
        num_prompts=64,
        samples_per_prompt=8,
        avg_prompt_len=256,
        avg_gen_len=1024,
        max_gen_len=2048,
        measured_step_s=300,
    )
    case = read_case(row)
    assert case.pp_open
    with pytest.raises(InfeasiblePlan):
        solve_layout(case, SHIPPED)
    priced, lay, pred = solve_row(case, SHIPPED)
    assert lay.solved["optimizer"] == "host" and lay.solved["train_pp"] >= 2
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 80.0
    # fewer stages do not fit
    fewer = replace(priced, layout=replace(priced.layout, train_pp=lay.train_pp // 2))
    with pytest.raises(InfeasiblePlan):
        solve_layout(fewer, SHIPPED)
    # a row that states its pipeline keeps it: nothing is assumed against a stated cell
    stated = read_case({**row, "train_pp": "1"})
    assert not stated.pp_open
    with pytest.raises(InfeasiblePlan):
        solve_row(stated, SHIPPED)
