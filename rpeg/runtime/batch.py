"""The typed batch that flows between stages."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rpeg import defaults
from rpeg.runtime.engines.torch_engine import positions_from_mask

#: per-sample tensor fields: ``[B]``
SAMPLE_FIELDS = (
    "policy_version",
    "group_ids",
    "rewards",
    "correct",
    "sample_index",
    "reward_parts",
)
#: per-token tensor fields: ``[B, R]``
TOKEN_FIELDS = (
    "response_ids",
    "response_mask",
    "sample_logprobs",
    "old_logprobs",
    "ref_logprobs",
    "values",
    "advantages",
    "returns",
    "response_attention",
)
#: prompt tensor fields: ``[B, P]`` (left-padded)
PROMPT_FIELDS = ("prompt_ids", "prompt_mask")
#: per-token fields with trailing dims: ``[B, R, ...]`` (cut and padded along ``R``)
ROUTE_FIELDS = ("routes",)
TEXT_FIELDS = ("prompts", "responses", "reference_answers", "data_sources")


@dataclass
class RolloutBatch:
    """``B`` samples (``B = num_prompts * samples_per_prompt``, groups contiguous).

    Written by generate: prompt_ids/prompt_mask ``[B,P]`` (left-padded), response_ids /
    response_mask ``[B,R]`` (right-padded), sample_logprobs ``[B,R]`` (behaviour policy),
    policy_version ``[B]`` (weights version that sampled each row), group_ids ``[B]``,
    prompts / responses / reference_answers (text), sample_index ``[B]`` (each row's position
    in its step's whole rollout, whatever rank holds it: what layout-invariant mini-batches
    are drawn from, rpeg.runtime.updates.minibatch_rows; None for batches built otherwise).
    Written later: rewards ``[B]``, correct ``[B]`` and reward_parts ``[B, K]`` (reward: each
    of the K rules of the RewardSet, in its order, before any length penalty), old_logprobs and
    ref_logprobs ``[B,R]`` (log-prob stages), values ``[B,R]`` (critic), advantages
    ``[B,R]`` and returns ``[B,R]`` (advantage stage).

    Multi-turn rollouts (rpeg.runtime.envs.rollout) also write response_attention ``[B,R]``:
    1 on every token of the transcript (the model's and the environment's); response_mask
    is then the loss mask, 1 only on the model's own tokens. None (single turn): the
    attention over the response is response_mask.

    A mixture-of-experts rollout recorded by the torch engine (``algorithm.routing_replay``)
    also carries routes ``[B, R, L, k]`` (int16): the experts each of the L routers chose
    for the forward that gave response token ``i`` its log-prob (input position ``P - 1 +
    i``; rpeg.runtime.engines.torch_engine). None otherwise.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    sample_logprobs: torch.Tensor
    policy_version: torch.Tensor
    group_ids: torch.Tensor
    prompts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    reference_answers: list[str] = field(default_factory=list)
    rewards: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    sample_index: torch.Tensor | None = None
    reward_parts: torch.Tensor | None = None
    temperature: float = defaults.TEMPERATURE
    response_attention: torch.Tensor | None = None
    data_sources: list[str] = field(default_factory=list)  # each row's data_source ([] = none)
    routes: torch.Tensor | None = None

    # --- derived ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return int(self.response_ids.shape[0])

    def __len__(self) -> int:
        return self.size

    @property
    def input_ids(self) -> torch.Tensor:
        """``[B, P+R]`` prompt then response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        r = self.response_mask if self.response_attention is None else self.response_attention
        return torch.cat([self.prompt_mask, r], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        return positions_from_mask(self.attention_mask)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def replace(self, **changes: Any) -> RolloutBatch:
        return dataclasses.replace(self, **changes)

    # --- slicing / joining ------------------------------------------------------------------
    def select(self, index: torch.Tensor | Sequence[int]) -> RolloutBatch:
        idx = torch.as_tensor(index, dtype=torch.long)
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                kw[f.name] = v[idx]
            elif isinstance(v, list):
                kw[f.name] = [v[i] for i in idx.tolist()] if v else []
            else:
                kw[f.name] = v
        # drop all-padding columns at the edges
        out = RolloutBatch(**kw)
        return out._trim()

    def _trim(self) -> RolloutBatch:
        p_keep = int(self.prompt_mask.sum(-1).max()) if self.size else 0
        r_mask = self.response_mask if self.response_attention is None else self.response_attention
        r_keep = int(r_mask.sum(-1).max()) if self.size else 0
        kw = {}
        p = self.prompt_ids.shape[1]
        if p_keep < p:
            kw.update(
                prompt_ids=self.prompt_ids[:, p - p_keep :],
                prompt_mask=self.prompt_mask[:, p - p_keep :],
            )
        if r_keep < self.response_ids.shape[1]:
            for name in (*TOKEN_FIELDS, *ROUTE_FIELDS):
                v = getattr(self, name)
                if v is not None:
                    kw[name] = v[:, :r_keep]
        return self.replace(**kw) if kw else self

    def split(self, n: int, generator: torch.Generator | None = None) -> list[RolloutBatch]:
        """``n`` near-equal mini-batches (shuffled when a generator is given)."""
        return [self.select(chunk) for chunk in chunk_order(self.size, n, generator, 1)]

    def micro_batches(self, size: int) -> list[RolloutBatch]:
        return [
            self.select(torch.arange(i, min(i + size, self.size)))
            for i in range(0, self.size, size)
        ]

    @staticmethod
    def concat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """Join batches, re-padding prompts (left) and responses (right). Group ids name a
        prompt's samples within one batch (every generation call numbers its prompts from
        0), so each part's ids are shifted past the previous parts': the joined batch keeps
        one id per prompt group (DAPO's group filter reads them)."""
        if len(batches) == 1:
            return batches[0]
        p = max(b.prompt_ids.shape[1] for b in batches)
        r = max(b.response_ids.shape[1] for b in batches)
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(RolloutBatch):
            vals = [getattr(b, f.name) for b in batches]
            if f.name in PROMPT_FIELDS:
                pad = 0
                kw[f.name] = torch.cat(
                    [torch.nn.functional.pad(v, (p - v.shape[1], 0), value=pad) for v in vals],
                    dim=0,
                )
            elif f.name in TOKEN_FIELDS:
                if any(v is None for v in vals):
                    kw[f.name] = None
                else:
                    kw[f.name] = torch.cat(
                        [torch.nn.functional.pad(v, (0, r - v.shape[1])) for v in vals], dim=0
                    )
            elif f.name in ROUTE_FIELDS:
                if any(v is None for v in vals):
                    kw[f.name] = None
                else:
                    kw[f.name] = torch.cat(
                        [_pad_dim1(v, r) for v in vals],
                        dim=0,
                    )
            elif f.name == "group_ids":
                kw[f.name] = torch.cat(_distinct_groups(vals), dim=0)
            elif f.name in SAMPLE_FIELDS:
                kw[f.name] = None if any(v is None for v in vals) else torch.cat(vals, dim=0)
            elif f.name in TEXT_FIELDS:
                kw[f.name] = [x for v in vals for x in v]
            else:
                kw[f.name] = vals[0]
        return RolloutBatch(**kw)

    # --- transport --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain dict (tensors + lists) for pickling between processes / actors."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutBatch:
        return cls(**data)


def chunk_order(
    size: int, n: int, generator: torch.Generator | None, group_size: int
) -> list[torch.Tensor]:
    """Indices ``0 .. size-1`` in ``n`` near-equal, non-empty chunks: a permutation drawn from
    ``generator``, or in order without one (how mini-batches are cut).

    ``group_size`` 1: a plain permutation. ``group_size`` K > 1 (indices ``g*K .. g*K+K-1``
    are the samples of prompt ``g``) and a generator: the permutation is *stratified* by
    prompt -- it is reordered into rounds,
    round ``j`` holding the ``j``-th drawn sample of every prompt (prompts in the order the
    permutation met them), and the rounds are cut into chunks. Each chunk then takes an
    equal share of every prompt's samples (K/n when n divides K): a stratified sample of
    the rollout, whose mean has no more variance than a simple random one (Cochran,
    *Sampling Techniques*, 1977, ch. 5). It also gives every data-parallel rank -- a
    contiguous shard of whole prompts -- the same number of rows in each chunk, where a
    simple random chunk gave them a hypergeometric share (the rank with more rows set the
    step: docs/parallelism.md "Layout-invariant runs"). The draws from ``generator`` are
    the same as unstratified."""
    order = torch.arange(size) if generator is None else torch.randperm(size, generator=generator)
    if generator is not None and group_size > 1 and size % group_size == 0:
        g = order // group_size  # each drawn index's prompt
        by_prompt = torch.argsort(g, stable=True)  # K entries per prompt, in drawn order
        round_of = torch.empty_like(order)
        round_of[by_prompt] = torch.arange(size) % group_size
        order = order[torch.argsort(round_of, stable=True)]
    return [c for c in torch.tensor_split(order, n) if len(c)]


def _pad_dim1(v: torch.Tensor, width: int) -> torch.Tensor:
    """``v [B, R, ...]`` padded with zeros to ``[B, width, ...]``."""
    if v.shape[1] >= width:
        return v
    pad = torch.zeros((v.shape[0], width - v.shape[1], *v.shape[2:]), dtype=v.dtype)
    return torch.cat([v, pad.to(v.device)], dim=1)


def _distinct_groups(ids: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Group-id tensors shifted so no two parts share an id (order and grouping kept)."""
    out, offset = [], 0
    for v in ids:
        out.append(v + offset)
        if v.numel():
            offset = int(out[-1].max()) + 1
    return out
