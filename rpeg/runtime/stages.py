"""Stage functions over :class:`RolloutBatch`: one per stage kind of the RPEG graph.

Each takes the worker that holds the model it needs (or nothing, for pure stages) and a batch,
and returns a new batch with its fields filled in plus a metrics dict.

    generate_stage -> reward_stage -> old_logprob_stage / logprob_stage(ref) / value_stage
                   -> advantage_stage -> train_actor_stage (+ train_critic_stage)

:func:`run_stage` maps an IR stage kind to its function over a :class:`StageContext` (the
workers one process hosts): the single-process trainer and every distributed actor run stage
kinds through it (the one stage loop, :mod:`rpeg.runtime.stage_loop`, calls it), so they
cannot drift apart. Weight sync is the stage loop's: it depends on where the generator lives.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rpeg import defaults
from rpeg.compile.rank_program import RoleInputs
from rpeg.compile.step import TaskSpec
from rpeg.config import AlgorithmConfig, RunConfig
from rpeg.runtime.algorithms import masked_mean, mismatch_metrics
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.critic import CriticWorker
from rpeg.runtime.data import Example
from rpeg.runtime.engines.base import SamplingParams
from rpeg.runtime.engines.torch_engine import left_pad
from rpeg.runtime.parallel import LOCAL, RankReduce
from rpeg.runtime.recipes import runtime_recipe
from rpeg.runtime.rewards import RewardSet
from rpeg.runtime.roles import PolicyWorker

Metrics = dict[str, float]


def generate_stage(
    worker: PolicyWorker,
    examples: Sequence[Example],
    samples_per_prompt: int,
    *,
    prompt_template: str = "{question}",
    params: SamplingParams | None = None,
    seed: int | None = None,
    first_row: int = 0,
) -> tuple[RolloutBatch, Metrics]:
    """Sample ``samples_per_prompt`` responses per example -> a batch of ``len(examples)*K`` rows
    (groups contiguous), with prompt/response ids, masks, sampling log-probs and policy version.
    ``first_row``: the first row's position in the step's whole rollout (a data-parallel
    rank's part of it); rows are numbered from there (``sample_index``)."""
    t0 = time.perf_counter()
    params = params or worker.sampling_params()
    prompts, rep_ids = _prompt_rows(worker, examples, samples_per_prompt, prompt_template)
    out = worker.generate(rep_ids, params, seed=seed)
    index = first_row + torch.arange(len(rep_ids))
    return _rollout_batch(
        worker, examples, prompts, rep_ids, out, samples_per_prompt, params, t0, index
    )


def generate_chunks(
    worker: PolicyWorker,
    examples: Sequence[Example],
    samples_per_prompt: int,
    *,
    min_prompts: int = 1,
    prompt_template: str = "{question}",
    params: SamplingParams | None = None,
    seed: int | None = None,
    first_row: int = 0,
) -> Iterator[tuple[RolloutBatch, Metrics]]:
    """:func:`generate_stage` as a stream: one decode of the whole batch (the same samples
    as :func:`generate_stage` with the same seed), yielding a batch of the prompts whose
    samples have all finished, ``min_prompts`` or more at a time, while the others decode.
    Each chunk's ``generate_s`` is the decode time since the previous release (they sum to
    the decode; what the consumer does with a chunk is not counted)."""
    t0 = time.perf_counter()
    params = params or worker.sampling_params()
    k = samples_per_prompt
    prompts, rep_ids = _prompt_rows(worker, examples, k, prompt_template)
    groups = [list(range(i * k, (i + 1) * k)) for i in range(len(examples))]
    for idx, out in worker.generate_in_groups(
        rep_ids, params, groups=groups, min_groups=min_prompts, seed=seed
    ):
        rows = [r for i in idx for r in groups[i]]
        batch, m = _rollout_batch(
            worker,
            [examples[i] for i in idx],
            [prompts[i] for i in idx],
            [rep_ids[r] for r in rows],
            out,
            k,
            params,
            t0,
            first_row + torch.as_tensor(rows, dtype=torch.long),
        )
        yield batch, m
        t0 = time.perf_counter()  # the consumer's work on the chunk is not decode time


def _prompt_rows(
    worker: PolicyWorker, examples: Sequence[Example], samples_per_prompt: int, template: str
) -> tuple[list[str], list[list[int]]]:
    """The prompts' texts and their token ids repeated ``samples_per_prompt`` times (groups
    contiguous): the rows of a rollout."""
    prompts = [ex.prompt(template) for ex in examples]
    rep_ids = [x for x in worker.encode_prompts(prompts) for _ in range(samples_per_prompt)]
    return prompts, rep_ids


def _rollout_batch(
    worker: PolicyWorker,
    examples: Sequence[Example],
    prompts: Sequence[str],
    rep_ids: Sequence[Sequence[int]],
    out: Any,
    samples_per_prompt: int,
    params: SamplingParams,
    t0: float,
    sample_index: torch.Tensor,
) -> tuple[RolloutBatch, Metrics]:
    """The rollout batch of ``examples`` from the engine's ``out`` for their ``rep_ids``
    (rows ``sample_index`` of the step's rollout)."""
    p_ids, p_mask = left_pad(rep_ids, worker.tokenizer.pad_token_id)
    mask = out.mask
    texts = worker.tokenizer.batch_decode(
        [row[: int(n)].tolist() for row, n in zip(out.response_ids, out.lengths, strict=True)],
        skip_special_tokens=True,
    )
    b = len(rep_ids)
    batch = RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=out.response_ids,
        response_mask=mask,
        sample_logprobs=out.logprobs,
        policy_version=torch.full((b,), out.policy_version, dtype=torch.long),
        group_ids=torch.arange(len(examples)).repeat_interleave(samples_per_prompt),
        prompts=[p for p in prompts for _ in range(samples_per_prompt)],
        responses=texts,
        reference_answers=[ex.answer for ex in examples for _ in range(samples_per_prompt)],
        data_sources=[ex.data_source for ex in examples for _ in range(samples_per_prompt)],
        sample_index=sample_index.to(torch.long),
        temperature=params.temperature if params.temperature > 0 else 1.0,
        routes=getattr(out, "routes", None),  # a recorded MoE rollout (routing_replay)
    )
    lengths = out.lengths.float()
    return batch, {
        "generate_s": time.perf_counter() - t0,
        "gen_tokens_per_s": out.stats.get("gen_tokens_per_s", 0.0),
        "response_length": float(lengths.mean()) if b else 0.0,
        "response_length_max": float(lengths.max()) if b else 0.0,
        "truncated_frac": float((~out.finished).float().mean()) if b else 0.0,
    }


def reward_stage(
    batch: RolloutBatch,
    rewards: RewardSet,
    *,
    max_response_tokens: int | None = None,
    overlong_penalty_tokens: int = defaults.OVERLONG_PENALTY_TOKENS,
) -> tuple[RolloutBatch, Metrics]:
    """Score every response; a reward that raises gives 0 and is counted (``reward_errors``).
    With ``overlong_penalty_tokens = W`` > 0 (DAPO soft overlong punishment) a response longer
    than ``max_response_tokens - W`` loses ``(len - (max - W)) / W`` (at most 1)."""
    t0 = time.perf_counter()
    res = rewards(
        batch.prompts, batch.responses, batch.reference_answers, batch.data_sources or None
    )
    r = torch.tensor(res.rewards, dtype=torch.float32)
    if overlong_penalty_tokens and max_response_tokens:
        start = max_response_tokens - overlong_penalty_tokens
        over = (batch.response_lengths.float() - start).clamp(min=0) / overlong_penalty_tokens
        r = r - over.clamp(max=1.0)
    correct = torch.tensor(res.correct, dtype=torch.float32)
    m = {
        "reward_s": time.perf_counter() - t0,
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std()) if r.numel() > 1 else 0.0,
        "accuracy": float(correct.mean()),
        "reward_errors": float(res.errors),
    }
    if len(res.per_reward) > 1:  # each rule's mean over the samples it scored
        m.update({f"reward/{name}": v for name, v in res.rule_means().items()})
    for src, (rew, acc, _n) in res.source_means().items():  # rewards by data source
        m[f"reward/{src}"] = rew
        m[f"accuracy/{src}"] = acc
    parts = torch.tensor(list(res.per_reward.values()), dtype=torch.float32).reshape(
        len(res.per_reward), len(res.rewards)
    )
    return batch.replace(rewards=r, correct=correct, reward_parts=parts.T.contiguous()), m


def logprob_stage(
    worker: PolicyWorker, batch: RolloutBatch, field: str = "old_logprobs"
) -> tuple[RolloutBatch, Metrics]:
    """Fill ``old_logprobs`` (the actor before this step's update) or ``ref_logprobs``
    (the frozen reference) with a forward pass: ``[B,R]``."""
    if field not in ("old_logprobs", "ref_logprobs"):
        raise ValueError(f"field must be old_logprobs or ref_logprobs, not {field!r}")
    t0 = time.perf_counter()
    lp = worker.compute_logprobs(batch)
    name = "old_logprob_s" if field == "old_logprobs" else "ref_logprob_s"
    return batch.replace(**{field: lp}), {name: time.perf_counter() - t0}


def value_stage(
    critic: CriticWorker | PolicyWorker, batch: RolloutBatch
) -> tuple[RolloutBatch, Metrics]:
    """Fill ``values`` ``[B,R]`` from a separate critic or the actor's shared value head."""
    t0 = time.perf_counter()
    v = critic.compute_values(batch)
    return batch.replace(values=v), {
        "value_s": time.perf_counter() - t0,
        "value_mean": float(masked_mean(v, batch.response_mask)),
    }


def behaviour_as_old(batch: RolloutBatch) -> tuple[RolloutBatch, Metrics]:
    """On-policy shortcut: the sampling log-probs *are* the old policy's log-probs."""
    return batch.replace(old_logprobs=batch.sample_logprobs.clone()), {}


def old_logprob_stage(
    worker: PolicyWorker,
    batch: RolloutBatch,
    *,
    shared_forward: bool = False,
    recompute: bool = False,
    mismatch_threshold: float = defaults.MISMATCH_THRESHOLD,
    reduce: RankReduce = LOCAL,
) -> tuple[RolloutBatch, Metrics]:
    """Fill ``old_logprobs`` ``[B,R]``: the policy before this step's update.

    On-policy samples reuse their sampling log-probs unless ``recompute``; samples from an
    older policy version (bounded staleness) always get a forward pass (decoupled PPO's
    proximal policy). ``shared_forward`` (the compiled unit's: actor-critic sharing): one
    forward of the actor's shared value head fills ``values`` too.
    Metrics: ``staleness_max`` (policy versions behind, max over the batch) and, whenever a
    forward computed them, the rollout/trainer mismatch between them and the engine's
    sampling log-probs (``logprob_mismatch_*``: rpeg.runtime.algorithms.mismatch, over the
    data-parallel group with ``reduce``).
    """
    lag = worker.policy_version - batch.policy_version
    m: Metrics = {"staleness_max": float(lag.max())}
    if shared_forward:
        t0 = time.perf_counter()
        lp, v = worker.compute_logprobs_and_values(batch)
        batch = batch.replace(old_logprobs=lp, values=v)
        m.update(old_logprob_s=time.perf_counter() - t0, shared_forward=1.0)
        m["value_mean"] = float(masked_mean(v, batch.response_mask))
    elif recompute or bool((lag > 0).any()):
        batch, lm = logprob_stage(worker, batch, "old_logprobs")
        m.update(lm)
    else:
        batch, lm = behaviour_as_old(batch)
        return batch, {**m, **lm}
    m.update(
        mismatch_metrics(
            batch.old_logprobs,
            batch.sample_logprobs,
            batch.response_mask,
            threshold=mismatch_threshold,
            reduce=reduce,
        )
    )
    return batch, m


@dataclass
class StageContext:
    """What one process runs stages with: the run config, the workers it hosts, the rewards,
    how its data-parallel group reduces batch statistics, and the compiled unit whose stages
    run (set by the stage loop, rpeg.runtime.stage_loop: its ``shared_forward``)."""

    config: RunConfig | RoleInputs  # a rank's: the sections of its RankProgram
    actor: PolicyWorker | None = None
    reference: PolicyWorker | None = None
    critic: CriticWorker | None = None
    rewards: RewardSet | None = None
    reduce: RankReduce = LOCAL
    unit: TaskSpec | None = None


STAGE_KINDS = (
    "generate",
    "reward",
    "old_logprob",
    "ref_logprob",
    "values",
    "advantage",
    "train_actor",
    "train_critic",
    "env",
)


def env_span(gen_end: float, metrics: Metrics) -> tuple[str, float, float]:
    """The timeline span of a multi-turn unit's ``env`` stage: the rollout ran the
    environment's calls between generate's turns and measured their time (``env_s``); the
    span is that much time ending where generate's ended (how long, not when: the calls
    interleave with the turns)."""
    env_s = float(metrics.get("env_s", 0.0))
    return ("env", gen_end - env_s, gen_end)


def run_generate_chunks(
    ctx: StageContext,
    examples: Sequence[Example],
    *,
    seed: int | None,
    min_prompts: int,
    first_row: int = 0,
) -> Iterator[tuple[RolloutBatch, Metrics]]:
    """The ``generate`` stage of :func:`run_stage` as a stream of finished prompt groups
    (:func:`generate_chunks`): what a streaming unit runs its later stages on."""
    c = ctx.config
    if c.task.multiturn.env:  # multi-turn: one chunk, the whole rollout (rpeg.runtime.envs)
        from rpeg.runtime.envs.rollout import run_multiturn

        return iter([run_multiturn(ctx, examples, seed=seed, first_row=first_row)])
    return generate_chunks(
        ctx.actor,
        examples,
        c.workload.samples_per_prompt,
        min_prompts=min_prompts,
        prompt_template=c.task.prompt_template,
        seed=seed,
        first_row=first_row,
    )


def run_stage(
    kind: str,
    ctx: StageContext,
    batch: RolloutBatch | None,
    *,
    examples: Sequence[Example] | None = None,
    seed: int | None = None,
    first_row: int = 0,
) -> tuple[RolloutBatch, Metrics]:
    """Run the stage ``kind`` (an IR stage kind, not ``sync_weights``) on ``batch``.

    ``generate`` ignores ``batch`` and samples ``config.workload.samples_per_prompt``
    responses for each of ``examples`` with ``seed``, numbering the rows from ``first_row``
    (a rank's part of the step's rollout).
    """
    c = ctx.config
    a, w = c.algorithm, c.workload
    if kind == "generate" and c.task.multiturn.env:  # multi-turn (rpeg.runtime.envs)
        from rpeg.runtime.envs.rollout import run_multiturn

        return run_multiturn(ctx, examples, seed=seed, first_row=first_row)
    if kind == "generate":
        return generate_stage(
            ctx.actor,
            examples,
            w.samples_per_prompt,
            prompt_template=c.task.prompt_template,
            seed=seed,
            first_row=first_row,
        )
    if batch is None:
        raise ValueError(f"stage {kind!r} needs a batch (run generate first)")
    if kind == "env":  # multi-turn: the rollout ran the environment between generate's turns
        return batch, {}
    if kind == "reward":
        batch, m = reward_stage(
            batch,
            ctx.rewards,
            max_response_tokens=w.max_response_tokens,
            overlong_penalty_tokens=a.overlong_penalty_tokens,
        )
        if a.dynamic_sampling:
            batch, fm = filter_groups(batch)
            m.update(fm)
        return batch, m
    if kind == "old_logprob":
        rc = a.rollout_correction
        return old_logprob_stage(
            ctx.actor,
            batch,
            shared_forward=ctx.unit is not None and ctx.unit.shared_forward,
            recompute=a.recompute_old_logprobs or rc.measure == "forward" or rc.apply_to == "all",
            mismatch_threshold=rc.mismatch_threshold,
            reduce=ctx.reduce,
        )
    if kind == "ref_logprob":
        return logprob_stage(ctx.reference, batch, "ref_logprobs")
    if kind == "values":
        if batch.values is not None:  # filled by the shared forward of old_logprob
            return batch, {}
        return value_stage(ctx.critic or ctx.actor, batch)
    if kind == "advantage":
        return advantage_stage(batch, a, w.samples_per_prompt, reduce=ctx.reduce)
    if kind == "train_actor":
        _, m = train_actor_stage(ctx.actor, batch)
        return batch, m
    if kind == "train_critic":
        _, m = train_critic_stage(ctx.critic, batch)
        return batch, m
    raise ValueError(f"unknown stage kind {kind!r}; allowed: {', '.join(STAGE_KINDS)}")


def filter_groups(batch: RolloutBatch) -> tuple[RolloutBatch, Metrics]:
    """DAPO dynamic sampling: drop groups whose rewards are all equal (zero advantage)."""
    keep = []
    for g in batch.group_ids.unique():
        idx = (batch.group_ids == g).nonzero().squeeze(-1)
        if batch.rewards[idx].std() > 0 if len(idx) > 1 else False:
            keep.append(idx)
    m = {"groups_kept_frac": len(keep) / max(len(batch.group_ids.unique()), 1)}
    if not keep:
        return batch, m
    return batch.select(torch.cat(keep)), m


def advantage_stage(
    batch: RolloutBatch,
    algorithm: AlgorithmConfig,
    group_size: int,
    *,
    reduce: RankReduce = LOCAL,
) -> tuple[RolloutBatch, Metrics]:
    """Fill ``advantages`` ``[B,R]`` (and ``returns`` for a recipe with a critic) with the
    estimator of ``algorithm.name``'s recipe (rpeg.runtime.recipes), which also subtracts the
    KL from the reward for the recipes that put it there.

    ``group_size``: samples per prompt (groups contiguous). ``reduce``: under data
    parallelism, batch-wide whitening spans every rank's shard (groups are never split
    across ranks, so group baselines need no reduction)."""
    t0 = time.perf_counter()
    out = runtime_recipe(algorithm.name).advantages(batch, algorithm, group_size, reduce)
    fields = {"advantages": out.advantages}
    if out.returns is not None:
        fields["returns"] = out.returns
    batch = batch.replace(**fields)
    return batch, {
        "advantage_s": time.perf_counter() - t0,
        "advantage_abs_mean": float(masked_mean(out.advantages.abs(), batch.response_mask)),
    }


def train_actor_stage(worker: PolicyWorker, batch: RolloutBatch) -> tuple[PolicyWorker, Metrics]:
    """Minibatched policy updates; returns the worker (new policy version) and metrics."""
    m = worker.train_step(batch)
    m["policy_version"] = float(worker.policy_version)
    return worker, m


def train_critic_stage(critic: CriticWorker, batch: RolloutBatch) -> tuple[CriticWorker, Metrics]:
    """Minibatched value updates toward ``batch.returns``."""
    return critic, critic.train_step(batch)
