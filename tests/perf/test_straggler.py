"""A data-parallel optimizer step waits for the rank that drew the most work
(rpeg.perf.passes.straggler): trainers lose strong scaling as their ranks multiply at a fixed
batch, packed or padded; forward passes and one rank do not wait."""

import math

import numpy as np
import pytest
from schema_rows import schema_row

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.lengths import LengthDist, expected_max_normal
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_row


def _stages(gpus: int, model: str = "qwen2.5-7b-instruct", **over: object):
    cells: dict[str, object] = dict(
        case_id=f"dp{gpus}",
        source="straggler test",
        model=model,
        gpu="h100",
        num_gpus=gpus,
        gpus_per_node=8,
        placement="colocated",
        gen_tp=1,
        train_tp=1,
        train_backend="fsdp2",
        num_prompts=256,
        samples_per_prompt=8,
        train_minibatches=4,
        avg_prompt_len=200,
        avg_gen_len=2000,
        max_gen_len=8192,
        seq_packing="yes",
        gpu_memory_utilization=0.8,
        has_ref="yes",
        has_critic="no",
        measured_step_s=100,
    )
    cells.update(over)
    return solve_row(read_case(schema_row({}, **cells)), SHIPPED)[2].stages


@pytest.fixture(scope="module")
def by_gpus():
    return {n: _stages(n) for n in (8, 64)}


def test_a_packed_trainer_waits_for_its_longest_rank(by_gpus):
    few, many = by_gpus[8]["train_actor"], by_gpus[64]["train_actor"]
    assert 1.0 < few.detail["straggler"] < many.detail["straggler"]
    # 2,048 samples, 4 optimizer steps: 64 samples per rank per step on 8 ranks, 8 on 64
    assert many.detail["straggler"] > 1.2
    # the pass's GPU-seconds grow by at least the wait (smaller micro-batches and the
    # collectives add to it)
    gpu_s = many.time_s * 64 / (few.time_s * 8)
    assert gpu_s >= many.detail["straggler"] / few.detail["straggler"] * 0.99


def test_forward_passes_do_not_wait(by_gpus):
    for n, st in by_gpus.items():
        assert st["ref_logprob"].detail["straggler"] == 1.0, n
        assert st["old_logprob"].detail["straggler"] == 1.0, n


def test_one_rank_does_not_wait():
    one = _stages(1, model="qwen2.5-0.5b-instruct", num_prompts=16)["train_actor"]
    assert one.detail["straggler"] == 1.0


def test_padded_rows_wait_for_the_rank_with_the_longest_micro_batches():
    # fixed rows padded to their longest: a rank's work is its micro-batches' longest rows
    few = _stages(8, seq_packing="no")["train_actor"].detail["straggler"]
    many = _stages(64, seq_packing="no")["train_actor"].detail["straggler"]
    assert 1.0 < few < many


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_a_padded_micro_batch_spread_matches_a_simulation(rows):
    lengths = LengthDist(2000, 8192, 1.0)
    rng = np.random.default_rng(3)
    draws = np.exp(rng.normal(lengths.mu, lengths.sigma, size=(200_000, rows)))
    longest = np.minimum(draws, lengths.cap).max(1) + 200
    assert lengths.padded_spread(rows, 200) == pytest.approx(
        longest.std() / longest.mean(), rel=0.02
    )
    # the longest of more rows varies less
    if rows > 1:
        assert lengths.padded_spread(rows, 200) < lengths.token_spread(200)


def test_more_samples_per_rank_wait_less():
    small = _stages(64, num_prompts=128)["train_actor"].detail["straggler"]
    large = _stages(64, num_prompts=1024)["train_actor"].detail["straggler"]
    assert small > large > 1.0
    # the excess falls as 1 / sqrt(samples per rank): 8x the batch, ~1/sqrt(8) of it
    assert (large - 1) / (small - 1) == pytest.approx(1 / math.sqrt(8), rel=0.02)


@pytest.mark.parametrize("sigma", [0.6, 1.0])
@pytest.mark.parametrize(("dp", "k"), [(4, 32), (16, 8), (16, 128), (64, 32)])
def test_the_wait_matches_a_simulation(sigma, dp, k):
    """The normal approximation against drawn lengths: the largest of ``dp`` ranks' token sums
    of ``k`` clamped lognormal samples, over its mean; the approximation's excess within 20%
    of the simulated one (it is low where few skewed samples sum)."""
    lengths = LengthDist(2000, 8192, sigma)
    rng = np.random.default_rng(7)
    draws = np.exp(rng.normal(lengths.mu, lengths.sigma, size=(3000, dp, k)))
    tokens = (np.minimum(draws, lengths.cap) + 200).sum(-1)
    simulated = float((tokens.max(-1) / (k * (200 + lengths.mean))).mean())
    priced = 1 + lengths.token_spread(200) * expected_max_normal(dp) / math.sqrt(k)
    assert (priced - 1) / (simulated - 1) == pytest.approx(1.0, abs=0.2)


def test_expected_max_of_normals():
    # exact values (Harter's tables): 0.5642 (2), 1.4236 (8), 2.0697 (32)
    for n, exact in ((2, 0.5642), (8, 1.4236), (32, 2.0697)):
        assert expected_max_normal(n) == pytest.approx(exact, abs=0.03)
    assert expected_max_normal(1) == 0.0
