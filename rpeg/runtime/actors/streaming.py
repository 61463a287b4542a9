"""Streaming units on a rank (docs/dataplane.md "Streaming"): the producer side, one decode
releasing finished prompt groups chunk by chunk, and the consumer side, a trainer rank
running its first unit on each chunk of its generator rank as it arrives. Both run the
unit's stages through the one stage loop (:class:`rpeg.runtime.stage_loop.StageLoop`, the
unit's: as the rank's unstreamed units) on chunks kept in the rank's batches
(:class:`rpeg.runtime.actors.rank_data.RankBatches`: its store and chunk list; its ``chunk``
method hands the chunks out)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rpeg.ir import StageKind
from rpeg.runtime.actors.rank_data import RankBatches
from rpeg.runtime.data import Example
from rpeg.runtime.stage_loop import StageLoop


def produce(
    loop: StageLoop,
    batches: RankBatches,
    step: int,
    kinds: Sequence[str],
    examples: Sequence[Example],
    chunk: int,
    seed: int,
    first_row: int,
) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """One decode of the rank's prompts; each time ``chunk`` more prompts have all their
    samples finished they run through the unit's later stages and are offered to a streaming
    consumer while the decode goes on. The samples are those of the unstreamed unit (the
    rank's generation ``seed``, rows numbered from ``first_row``, same decode); rows come in
    the order their prompts finished; every rank releases ``ceil(prompts / chunk)`` chunks.

    Ranks of a data-parallel group finish their prompts at different decode steps, so a stage
    that runs collectives (a forward's micro-batch agreement, FSDP gathers, batch statistics)
    cannot run between decode steps: with dp > 1 only the unit's leading rule rewards run per
    chunk, the rest once on the joined batch after the decode. -> (metrics, spans)."""
    from rpeg.runtime import stages as S
    from rpeg.runtime.actors.dataplane import concat_rows

    later = list(kinds[1:])
    store = batches.store
    n_local = len(later) if loop.ctx.reduce.world_size == 1 else leading(later, StageKind.reward)
    per_chunk, after = later[:n_local], later[n_local:]
    parts, spans, per = [], [], []
    t_gen = t_last = time.time()
    for i, (b, gm) in enumerate(
        S.run_generate_chunks(loop.ctx, examples, seed=seed, min_prompts=chunk, first_row=first_row)
    ):
        t_last = time.time()  # this chunk's samples are done decoding
        key = ("chunk", step, i)
        store[key] = b
        m, sp = loop.run_stages(per_chunk, store, key, seed=seed)
        b = store.pop(key)
        parts.append(b)
        batches.offer_chunk(step, b)  # for a streaming consumer
        per.append(({**gm, **m}, b.size))
        spans.extend(sp)
    spans.insert(0, (StageKind.generate.value, t_gen, t_last))
    batches.end_chunks(step)
    store[step] = concat_rows(parts)
    out = weighted(per)
    if after:
        m, sp = loop.run_stages(after, store, step, seed=seed)
        out.update(m)
        spans.extend(sp)
    return out, spans


def consume(
    loop: StageLoop, batches: RankBatches, step: int, kinds: Sequence[str], producer: Any
) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """The consumer side of streaming across groups: run ``kinds`` on each chunk of the
    producer rank's rows as it arrives (while the producer generates the next)."""
    from rpeg.runtime.actors.dataplane import concat_rows, tensor_bytes

    store = batches.store
    parts, spans, per = [], [], []
    i = 0
    while True:
        b = producer.chunk(step, i).result()
        if b is None:
            break
        batches.received_bytes += tensor_bytes(b)
        key = ("stream", step, i)
        store[key] = b
        m, sp = loop.run_stages(kinds, store, key, seed=0)
        b = store.pop(key)
        parts.append(b)
        per.append((m, b.size))
        spans.extend(sp)
        i += 1
    store[step] = concat_rows(parts)
    return weighted(per), spans


def leading(kinds: list[str], kind: str) -> int:
    """How many of ``kinds``, from the first, are ``kind``."""
    n = 0
    while n < len(kinds) and kinds[n] == kind:
        n += 1
    return n


def weighted(per: list[tuple[dict[str, Any], int]]) -> dict[str, float]:
    """Metrics of a streamed unit from its chunks: times summed, maxima maxed, the rest
    averaged weighted by the chunk's samples."""
    out: dict[str, float] = {}
    total = sum(n for _, n in per) or 1
    for key in {k for m, _ in per for k in m}:
        vals = [(m[key], n) for m, n in per if key in m and isinstance(m[key], int | float)]
        if not vals:
            continue
        if key.endswith("_s") or key.endswith("_errors"):
            out[key] = float(sum(v for v, _ in vals))
        elif key.endswith("_max"):
            out[key] = float(max(v for v, _ in vals))
        else:
            out[key] = float(sum(v * n for v, n in vals) / total)
    out["stream_chunks"] = float(len(per))
    return out
