"""The generation-engine interface every engine implements (torch here, vLLM on GPU)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from rpeg import defaults


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy.

    ``max_new_tokens`` caps every response; ``stop_token_ids`` end a response (the stop token is
    kept in the response, like EOS). ``top_k == 0`` and ``top_p == 1`` disable those filters.
    """

    max_new_tokens: int = 16
    temperature: float = defaults.TEMPERATURE
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class GenerationOutput:
    """What :meth:`GenerationEngine.generate` returns for ``B`` prompts.

    * ``response_ids``: ``[B, R]`` long, right-padded with ``pad_id`` (R = longest response)
    * ``logprobs``: ``[B, R]`` float, log-prob of each sampled token under the *sampling
      policy before top-k/top-p truncation* (softmax of logits / temperature; temperature 0 -> 1),
      0 on padding -- the value the trainer's own forward computes for the same token
    * ``lengths``: ``[B]`` long, tokens in each response (stop token included)
    * ``finished``: ``[B]`` bool, True if a stop/EOS token ended the response (False = cap hit)
    * ``logprobs_exact``: False when an engine could only report other log-probs (vLLM without
      processed log-probs, or with top-k/top-p truncation on); the run must then recompute
      old log-probs with a forward pass (``algorithm.recompute_old_logprobs``)
    * ``routes``: ``[B, R, L, k]`` int16, the experts each router chose for each response
      token's forward (a mixture-of-experts model, the torch engine when recording: its
      ``record_routes``; vLLM returns none to rpeg: vllm_requests.routes_refusal); None
      otherwise
    """

    response_ids: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor
    policy_version: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    logprobs_exact: bool = True
    routes: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:
        r = self.response_ids.shape[1]
        return (torch.arange(r)[None, :] < self.lengths[:, None]).to(torch.long)


@runtime_checkable
class GenerationEngine(Protocol):
    """Batched sampling from the current policy weights.

    ``max_new_tokens`` may be one int per prompt (a per-sample response cap) overriding
    ``params.max_new_tokens``. ``seed`` makes sampling reproducible: prompt ``i`` is sampled
    from its own stream seeded ``seed + i``, whatever else is in the batch, so a batch split
    into parts (the first row of each part seeded with its global index: ``row_sampling.
    rollout_seed``) samples what the whole batch samples. ``seed`` may also be one seed per
    prompt (``row_sampling.row_seeds``): rows that are not consecutive positions (a
    multi-turn rollout's later turns).
    """

    policy_version: int

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        seed: int | Sequence[int] | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput: ...

    def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], policy_version: int
    ) -> None: ...


def refresh_engine(
    engine: GenerationEngine,
    module: torch.nn.Module,
    weights: Mapping[str, torch.Tensor],
    policy_version: int,
) -> None:
    """After a role's weights were replaced by ``weights``: an engine that generates with the
    role's own ``module`` only takes the new version; one holding its own copy (vLLM, or a
    private torch copy) loads them."""
    if getattr(engine, "model", None) is module:
        engine.policy_version = policy_version
    else:
        engine.update_weights(weights, policy_version)


def generate_in_groups(
    engine: GenerationEngine,
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    groups: Sequence[Sequence[int]],
    min_groups: int = 1,
    seed: int | None = None,
    max_new_tokens: Sequence[int] | None = None,
) -> Iterator[tuple[list[int], GenerationOutput]]:
    """``(group indices, their output)`` as groups of rows finish, ``min_groups`` at a time
    (the last release: the rest), always ``ceil(len(groups) / min_groups)`` releases: an
    engine with a ``generate_streaming`` (the torch engine) releases them during the decode;
    any other engine (vLLM's offline ``LLM.generate`` returns when the whole batch is done)
    releases them all at the end."""
    stream = getattr(engine, "generate_streaming", None)
    if stream is not None:
        yield from stream(
            prompt_ids,
            params,
            groups=groups,
            min_groups=min_groups,
            seed=seed,
            max_new_tokens=max_new_tokens,
        )
        return
    out = engine.generate(prompt_ids, params, seed=seed, max_new_tokens=max_new_tokens)
    m = max(1, min_groups)
    for i in range(0, len(groups), m):
        take = list(range(i, min(i + m, len(groups))))
        rows = torch.as_tensor([r for g in take for r in groups[g]], dtype=torch.long)
        yield (
            take,
            GenerationOutput(
                response_ids=out.response_ids[rows],
                logprobs=out.logprobs[rows],
                lengths=out.lengths[rows],
                finished=out.finished[rows],
                policy_version=out.policy_version,
                stats=dict(out.stats),
                logprobs_exact=out.logprobs_exact,
                routes=None if out.routes is None else out.routes[rows],
            ),
        )
