"""The step's schedule where units overlap (pure): the k = 0 streaming flow shop, and the
timeline record of a unit. The other schedules (one pool back to back, k >= 1 pools in
parallel) are in :func:`rpeg.perf.pricing.predict`; docs/perf-model.md, "Equations"."""

from __future__ import annotations

from typing import Any

from rpeg.perf.prediction import StageCost
from rpeg.perf.timeline import TimelineRecord
from rpeg.perf.units import GEN_KIND


def record(sc: StageCost, start: float, end: float) -> TimelineRecord:
    """The timeline record of unit ``sc`` running from ``start`` to ``end``."""
    return TimelineRecord(sc.name, sc.devices, start, end, kind=sc.kinds[0] if sc.kinds else "")


def streamed(
    stages: dict[str, StageCost],
    units: list[Any],
    pool_of: dict[str, int],
    m: int,
    timeline: list[TimelineRecord],
) -> float:
    """Schedule of a k = 0 streaming step (see ``predict``); returns its end, appends one
    record per unit from its first chunk's start to its last chunk's end (a pool's units
    interleave chunk by chunk, so their records overlap; each record's busy time is the
    unit's time)."""
    gen_end = 0.0
    for uname, members in units:
        if GEN_KIND in {k for _, k, _ in members}:
            d = stages[uname].time_s
            timeline.append(record(stages[uname], gen_end, gen_end + d))
            gen_end += d
    free: dict[int, float] = {}  # device pool (host side of pool i: -1 - i) -> free at
    streamed, after = [], []
    for uname, members in units:
        kinds = {k for _, k, _ in members}
        pool = pool_of[uname]
        if GEN_KIND in kinds:
            free[pool] = gen_end
        elif "sync_weights" in kinds:
            after.append((uname, pool))
        elif all(k == "reward" and r != "reward_model" for _, k, r in members):
            streamed.append((uname, -1 - pool))  # a rule reward runs on the host
        else:
            streamed.append((uname, pool))
    span: dict[str, list[float]] = {}
    end = gen_end
    for j in range(m):  # chunk by chunk: each pool takes a chunk through its units in order
        t = gen_end * (j + 1) / m  # chunk j generated
        for uname, pool in streamed:
            s = max(t, free.get(pool, 0.0))
            t = free[pool] = s + stages[uname].time_s / m
            span.setdefault(uname, [s, t])[1] = t
        end = max(end, t)
    for uname, _ in streamed:
        timeline.append(record(stages[uname], *span[uname]))
    for uname, pool in after:
        s = max(end, free.get(pool, 0.0))
        end = free[pool] = s + stages[uname].time_s
        timeline.append(record(stages[uname], s, end))
    return max(end, *free.values())
