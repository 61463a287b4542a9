"""A group's ``num_tokens`` counts the step's batch once per data-parallel index: the
tensor-parallel ranks of one dp index hold the same rows (rpeg.runtime.actors.unit_result.
counted_tokens; each tp rank used to report the whole batch, doubling tp=2 runs' tokens)."""

from rpeg.runtime.actors.unit_result import UnitResult, counted_tokens, reduce_results
from rpeg.runtime.mesh import Layout


def test_only_tp_index_zero_counts_the_batch():
    assert counted_tokens(100, 0) == 100.0
    assert counted_tokens(100, 1) is None
    assert counted_tokens(None, 0) is None  # a rank without the step's batch


def test_tp2_dp2_group_sums_each_dp_index_once():
    # hand-worked: tp=2 x dp=2, ranks 0-1 are dp index 0 (100 tokens each hold), ranks 2-3
    # dp index 1 (120 tokens): the group's tokens are 100 + 120 = 220, not 440
    lay = Layout(dp=2, tp=2)
    held = {0: 100, 1: 100, 2: 120, 3: 120}
    results = [
        UnitResult(metrics={"unit_s": 1.0}, num_tokens=counted_tokens(t, lay.tp_index(r)))
        for r, t in held.items()
    ]
    assert [lay.tp_index(r) for r in held] == [0, 1, 0, 1]
    assert reduce_results(results)["num_tokens"] == 220.0


def test_pure_data_parallel_counts_every_rank():
    lay = Layout(dp=2, tp=1)  # two dp ranks hold different rows: 64 + 60
    results = [
        UnitResult(metrics={}, num_tokens=counted_tokens(t, lay.tp_index(r)))
        for r, t in {0: 64, 1: 60}.items()
    ]
    assert reduce_results(results)["num_tokens"] == 124.0
