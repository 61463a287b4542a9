"""How a step's rows are split over the data-parallel indices of a group: contiguous,
near-equal shards of whole prompts (their samples, GRPO/RLOO groups, stay together), each
generating rank told where its prompts start in the step's batch (the position its rows'
sampling seeds and mini-batch membership come from: docs/parallelism.md "Layout-invariant runs")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rpeg.compile.rank_program import RoleInputs
from rpeg.config import RunConfig
from rpeg.runtime.data import PromptShard
from rpeg.runtime.engines.row_sampling import rollout_seed


def shard(items: Sequence[Any], n: int) -> list[list[Any]]:
    """Contiguous, near-equal shards (groups of samples stay together)."""
    k, r = divmod(len(items), n)
    out, i = [], 0
    for j in range(n):
        m = k + (1 if j < r else 0)
        out.append(list(items[i : i + m]))
        i += m
    return out


def prompt_shards(examples: Sequence[Any], n: int) -> list[PromptShard]:
    """Whole prompts per data-parallel index (:func:`shard`), each with its first prompt's
    position in the step's batch (what its rows' sampling seeds come from)."""
    out, first = [], 0
    for part in shard(examples, n):
        out.append(PromptShard(first=first, examples=tuple(part)))
        first += len(part)
    return out


def shard_groups(size: int, n: int, group_size: int) -> list[list[int]]:
    """Sample indices of ``n`` shards made of whole groups of ``group_size`` contiguous
    samples (GRPO/RLOO groups are never split across ranks)."""
    if group_size <= 1 or size % group_size:
        return shard(list(range(size)), n)
    return [
        [g * group_size + j for g in gs for j in range(group_size)]
        for gs in shard(list(range(size // group_size)), n)
    ]


def rollout_start(
    config: RunConfig | RoleInputs, step: int, prompts: PromptShard | None
) -> tuple[int, int]:
    """``(seed, first row)`` of the rank generating ``prompts`` of ``step``: its first row's
    position in the step's whole rollout and that row's sampling seed, so every layout (and
    the single-process trainer: row 0) samples and numbers each row alike; the tp ranks of
    one dp index share them."""
    first = 0 if prompts is None else prompts.first * config.workload.samples_per_prompt
    return rollout_seed(config.runtime.seed, step, first), first
