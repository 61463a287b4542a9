"""What one rank returns from one execution unit, and how ranks' metrics combine.

A :class:`UnitResult` carries the unit's metrics and, as fields, the timing of the stages
inside the call (``spans``) and the rank's process id: nothing is smuggled in the metrics
dict. :data:`REDUCTIONS` declares once how each metric combines across the ranks of a group
(the slowest rank's time, the sum of token counts); every other metric is the mean over the
ranks that reported it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpeg.runtime.samples import Sample


@dataclass(frozen=True)
class Span:
    """One stage inside an actor call: kind, wall-clock start and end (seconds, epoch)."""

    stage: str
    start: float
    end: float


@dataclass(frozen=True)
class PipelineAction:
    """One action of a pipelined training pass on this rank (rpeg.runtime.pipeline): a
    forward ``F`` or backward ``B`` of model chunk ``chunk`` on micro-batch ``micro``,
    wall-clock start and end (seconds, epoch) and the seconds of it spent waiting on the
    point-to-point receives of its input."""

    kind: str
    chunk: int
    micro: int
    start: float
    end: float
    wait: float = 0.0


@dataclass(frozen=True)
class UnitResult:
    """One rank's result of one unit: metrics (reduced over ranks by :data:`REDUCTIONS`),
    the stages' spans, a pipelined trainer's actions and the process id (the timeline's), and
    what the rank now holds of the step's batch (``rows``, ``batch_bytes``: the data plane's; None/0 without a batch)."""

    metrics: dict[str, float]
    spans: tuple[Span, ...] = ()
    pid: int = -1
    num_tokens: float | None = None
    rows: int | None = None
    batch_bytes: int = 0
    samples: tuple[Sample, ...] = ()  # a logged step's sample rows (its advantage unit's)
    actions: tuple[PipelineAction, ...] = ()  # a pipelined trainer's actions in the call


def counted_tokens(batch_tokens: float | None, tp_index: int) -> float | None:
    """The tokens a rank reports for the step's batch (``num_tokens``, summed over the
    group's ranks by :data:`REDUCTIONS`): the tp ranks of one dp index hold the same rows,
    so only tp index 0 counts them; None without a batch or on the other tp ranks."""
    if batch_tokens is None or tp_index:
        return None
    return float(batch_tokens)


def _mean(vals: Sequence[float]) -> float:
    return sum(vals) / len(vals)


# How a metric combines over a group's ranks. Times: the step waits for the slowest rank.
# Per-rank throughputs keep the slowest-rank view the runtime always reported (max).
REDUCTIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "unit_s": max,
    "generate_s": max,
    "reward_s": max,
    "old_logprob_s": max,
    "ref_logprob_s": max,
    "value_s": max,
    "advantage_s": max,
    "train_s": max,
    "critic_train_s": max,
    "weight_sync_s": max,
    "gen_tokens_per_s": max,
    "train_tokens_per_s": max,
    # maxima of the step's rows: the largest of the ranks' (not their mean)
    "response_length_max": max,
    "staleness_max": max,
    "num_tokens": sum,
}


def reduce_results(results: Sequence[UnitResult]) -> dict[str, float]:
    """One metrics dict for a unit from every rank's result (a single rank: its metrics)."""
    per_rank = [dict(r.metrics) for r in results]
    for m, r in zip(per_rank, results, strict=True):
        if r.num_tokens is not None:
            m["num_tokens"] = float(r.num_tokens)
    if len(per_rank) == 1:
        return per_rank[0]
    keys: list[str] = []
    for m in per_rank:
        keys += [k for k in m if k not in keys]
    return {k: REDUCTIONS.get(k, _mean)([m[k] for m in per_rank if k in m]) for k in sorted(keys)}
