"""What a row's prediction rests on, and which of it no published run of another source checks
(pure).

The model prices mechanisms that no shipped row exercises -- a GPU no published run was
measured on, a PPO critic, a learned reward model, DeepSpeed-Chat's static batches, ZeRO-1/2,
speculative decoding, a vision tower, hybrid linear attention, the optimizer on the host, a
critic on a pool of its own --
from their documentation. A row that rests on one is predicted as well as the model can, but
its range should say that nothing measured backs that term. ``rpeg validate`` names, for each
row, the mechanisms its prediction uses (:func:`of`) and, leave-one-source-out, those no row of
another source uses (:func:`unchecked`); each widens the row's LOSO range by
:data:`MECHANISM_FACTOR` either way, in quadrature with its other terms (docs/validation.md,
"Ranges"). The system itself is not one of them: a system no other source ran already widens
the range (``loso.UNKNOWN_WIDEN``). The rows checking a mechanism are whatever rows
are scored together -- the shipped sets and a user's file -- so a mechanism stops widening
ranges as soon as a published run of it joins the data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

#: a mechanism no published run of another source checks moves the step by this factor
#: either way: the factor of a stand-in architecture (rpeg.perf.interval.ARCH_FACTOR, measured
#: on the shipped rows: 1.30x at the 80th percentile, 1.75x at the 90th) -- a priced term with
#: no published check is trusted no more than a shape the catalog lacks
MECHANISM_FACTOR = 1.5


def of(case: Any, solved: dict[str, Any]) -> tuple[str, ...]:
    """The named mechanisms a row's prediction uses (``case``: rows.RowCase; ``solved``: the
    layout fields its solve chose, rpeg.perf.validation.solve)."""
    from rpeg import specs

    wl, model = case.workload, case.model
    out = [f"gpu {specs.cluster(case.cluster_name).gpu.name}"]
    out.append("trainer " + ("zero-1/2" if case.zero_stage in (1, 2) else case.engine))
    if case.builder == "ppo":
        out.append("ppo critic")
    if getattr(case, "critic_gpus", 0):
        out.append("critic on a pool of its own")
    if case.reward_model:
        out.append("learned reward model")
    if wl.gen_static_batch:
        out.append("static-batch generation")
    if wl.spec_draft_tokens:
        out.append("speculative decoding")
    if wl.gen_max_seqs:
        out.append("engine running-request cap")
    if model.vision is not None and (wl.image_tokens is None or wl.image_tokens > 0):
        out.append("vision tower")
    if model.linear_attn:
        out.append("hybrid linear attention")
    if model.moe is not None:
        out.append("mixture of experts")
    if solved.get("optimizer") == "host" or wl.assumed_optimizer_on_host:
        out.append("optimizer on the host")
    if solved.get("idle_models") == "host":
        out.append("idle models on the host")
    return tuple(out)


def unchecked(rows: Iterable[Any]) -> dict[str, tuple[str, ...]]:
    """case id -> the mechanisms of the row (``rows``: anything with ``case_id``, ``source``,
    ``mechanisms`` and ``measured_s``) that no row of another source with a measured step
    time uses."""
    rows = list(rows)
    sources: dict[str, set[str]] = {}
    for p in rows:
        if p.measured_s:
            for m in p.mechanisms:
                sources.setdefault(m, set()).add(p.source)
    return {
        p.case_id: tuple(m for m in p.mechanisms if not sources.get(m, set()) - {p.source})
        for p in rows
    }


def extra_width(names: tuple[str, ...]) -> float:
    """Log half-width the unchecked mechanisms ``names`` add (independent, in quadrature)."""
    return math.log(MECHANISM_FACTOR) * math.sqrt(len(names))
