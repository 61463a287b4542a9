"""Activation memory of a trainer under tensor parallelism (rpeg.perf.passes.activation_memory):
Megatron-style trainers run sequence parallelism, so everything a recomputing rank keeps --
the layer inputs and the one layer it recomputes -- splits over tp; RPEG's own tensor
parallelism keeps the layer inputs, layer-norm inputs and dropout masks whole on every tp
rank."""

from dataclasses import replace

import pytest
from schema_rows import schema_row

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.passes import sequence_parallel
from rpeg.perf.pricing import predict
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_row


def _row(backend, **over):
    cells = dict(
        case_id="sp",
        source="a report",
        model="llama-3-70b",
        gpu="h100",
        num_gpus=64,
        gpus_per_node=8,
        placement="colocated",
        train_backend=backend,
        num_prompts=64,
        samples_per_prompt=8,
        avg_prompt_len=256,
        avg_gen_len=8192,
        max_gen_len=16384,
        measured_step_s=300,
    )
    return schema_row(cells, **over)


def _activations_gb(case, tp, pp=1, recompute=True):
    lay = replace(
        case.layout,
        gen_gpus=None,
        gen_tp=8,
        train_tp=tp,
        train_pp=pp,
        train_ep=1,
        recompute=recompute,
        gpu_memory_utilization=0.8,
    )
    pred = predict(case.graph, case.plan(lay), case.workload, calib=SHIPPED, check_memory=False)
    return pred.stages["train_actor"].memory_gb["activations"]


def test_which_trainers_split_their_layer_inputs():
    assert sequence_parallel("megatron", 8) and not sequence_parallel("megatron", 1)
    for engine in ("fsdp", "torch", "auto"):
        assert not sequence_parallel(engine, 8)


def test_a_megatron_rank_keeps_one_tp_share_of_the_recomputed_activations():
    case = read_case(_row("megatron"))
    assert case.engine == "megatron"
    one, eight = _activations_gb(case, 1), _activations_gb(case, 8)
    assert one > 0 and eight == pytest.approx(one / 8)


def test_without_sequence_parallelism_the_layer_inputs_stay_whole_on_every_tp_rank():
    case = read_case(_row("fsdp"))
    assert case.engine == "fsdp"
    one, eight = _activations_gb(case, 1), _activations_gb(case, 8)
    # only the recomputed layer's own set shrinks with tp: far less than 8x
    assert one / 8 < eight < one


def test_a_405b_megatron_run_at_32k_tokens_is_priced():
    # TP8 x PP8 on 64 H100: a 1F1B pipeline's first stage keeps eight micro-batches' layer
    # inputs of its 16 layers; whole on every tp rank they are ~140 GB at 32k tokens, split
    # by sequence parallelism ~18 GB
    row = _row(
        "megatron",
        model="llama-3.1-405b",
        num_prompts=64,
        samples_per_prompt=16,
        avg_gen_len="",
        max_gen_len=32768,
        train_tp=8,
        train_pp=8,
    )
    priced, lay, pred = solve_row(read_case(row), SHIPPED)
    train = pred.stages["train_actor"]
    assert (lay.train_tp, lay.train_pp) == (8, 8)
    assert train.memory_gb["activations"] < 30.0
    assert train.peak_memory_gb <= 80.0


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_without_recompute_a_tp_rank_keeps_korthikantis_share(tp):
    # Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, per layer and token in units of
    # s*b*h bytes with flash attention: 34 unsplit, 10 + 24/t under tensor parallelism, 34/t
    # with sequence parallelism too
    for backend, share in (("fsdp", (10 + 24 / tp) / 34), ("megatron", 1 / tp)):
        case = read_case(_row(backend))
        one = _activations_gb(case, 1, recompute=False)
        assert _activations_gb(case, tp, recompute=False) == pytest.approx(one * share), backend
