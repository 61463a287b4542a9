"""A blank expert-parallel size of a MoE trainer is solved like TP (rpeg.perf.validation.solve), so a
Megatron run of a MoE model that does not publish EP is priced instead of refused."""

import pytest

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.prediction import GB
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import _ep_candidates, solve_layout

ROW = dict(
    case_id="x",
    source="s",
    algorithm="grpo",
    gpu="H100",
    num_gpus="32",
    gpus_per_node="8",
    placement="colocated",
    train_backend="megatron",
    precision="bf16",
    num_prompts="128",
    samples_per_prompt="8",
    staleness="0",
    partial_rollout="no",
    has_ref="yes",
    has_critic="no",
    measured_step_s="100",
    model="Qwen3-Next-80B-A3B-Instruct",
    max_gen_len="4096",
)


def test_ep_candidates_divide_the_experts_and_the_data_parallel_ranks():
    class M:
        class moe:
            experts = 512

    # 32 GPUs at TP 2: 16 data-parallel ranks -> 1, 2, 4, 8, 16 (all divide 512 experts)
    assert _ep_candidates(M, 16) == [1, 2, 4, 8, 16]
    M.moe.experts = 12  # 12 experts: 8 and 16 do not divide them
    assert _ep_candidates(M, 16) == [1, 2, 4]


def test_a_megatron_moe_run_without_ep_is_priced_with_ep_solved():
    case = read_case(ROW)
    assert case.layout.train_ep is None  # open, not defaulted to 1
    lay, pred = solve_layout(case, SHIPPED)
    # 79.7 B parameters, 512 experts: EP 1 puts all experts (155 GB of bf16 weights) on
    # every H100, so only EP > 1 fits
    assert lay.solved["train_ep"] > 1 and pred.step_s > 0


def test_an_fsdp_moe_run_keeps_ep_one():
    case = read_case({**ROW, "train_backend": "fsdp", "model": "Qwen3-30B-A3B"})
    assert case.layout.train_ep == 1 and "train_ep" not in case.layout.open_fields


def test_long_sequences_hold_the_logits_of_one_chunk():
    # Qwen3.5-9B (248,320-token vocabulary) on 8 H100 with FSDP at the reasoning prior's
    # 32,768-token cap: the whole micro-batch's fp32 logits (x2 in training) would be
    # 32,918 x 248,320 x 8 B = 65 GB; a chunk of 8,192 tokens holds
    # 8,192 x 248,320 x 8 B = 16.27 GB and the row fits
    case = read_case(
        {**ROW, "num_gpus": "8", "train_backend": "fsdp", "model": "Qwen3.5-9B", "max_gen_len": ""}
    )
    _, pred = solve_layout(case, SHIPPED)
    gb = pred.stages["train_actor"].memory_gb["logits"]
    assert gb * GB == pytest.approx(8192 * 248320 * 8, rel=1e-3)
