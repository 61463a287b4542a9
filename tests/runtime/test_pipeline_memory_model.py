"""The memory model's picture of a pipeline (rpeg.perf.rank_memory) against the runtime's own
schedules and layer split (rpeg.runtime.pipeline): the layers each rank holds and the most
chunk-forwards whose activations a rank keeps at once."""

from __future__ import annotations

import pytest

from rpeg.perf.rank_memory import inflight_chunks, stage_layers
from rpeg.runtime.pipeline import PP_SCHEDULES, chunks_per_rank, schedule_orders, split_layers


def _most_in_flight(order) -> int:
    held = peak = 0
    for a in order:
        held += 1 if a.kind == "F" else -1
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("schedule", PP_SCHEDULES)
@pytest.mark.parametrize("pp,m", [(2, 1), (2, 4), (3, 5), (4, 4), (4, 16)])
def test_in_flight_activations_match_the_schedules(schedule, pp, m):
    orders = schedule_orders(schedule, pp, m)
    assert [inflight_chunks(schedule, pp, m, r) for r in range(pp)] == [
        _most_in_flight(o) for o in orders
    ]


@pytest.mark.parametrize("schedule", PP_SCHEDULES)
@pytest.mark.parametrize("layers,pp", [(8, 2), (7, 2), (28, 4), (30, 4)])
def test_layers_per_rank_match_the_split(schedule, layers, pp):
    v = chunks_per_rank(schedule)
    chunks = split_layers(layers, pp * v)
    held = [sum(len(chunks[k]) for k in range(r, pp * v, pp)) for r in range(pp)]
    assert [stage_layers(layers, pp, r, v) for r in range(pp)] == held
