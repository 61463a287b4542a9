"""Validation as verl users know it: the policy's current weights on the held-out prompts
(``task.val_url``, or ``task.heldout_size`` rows of the training data), greedy, scored by the
task's rewards (routed by data source: ``task.reward_by_source``).

:func:`validation_metrics` gives ``val/accuracy``, ``val/reward`` and, for every named data
source, ``val/<source>/accuracy`` and ``val/<source>/reward``; with ``samples`` k > 1
(sampled at the workload's temperature, ``rpeg eval --samples k``) also ``val/pass@k`` (a
prompt counts when any of its k samples is correct) per source. Both runtimes call it:
the local trainer directly, every rank of the trainer group through ``RankActor.evaluate``
(rank 0's metrics stand). ``runtime.val_every`` and ``runtime.val_before_train`` say when.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.data import Example

PREFIX = "val/"
#: prompts generated per call (a 500-prompt validation file is not one batch)
CHUNK_PROMPTS = 64
#: metrics.jsonl / summary key of the number of prompts validated
COUNT = "val/prompts"


def validation_batch(
    actor: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    rewards: Any,
    prompt_template: str,
    *,
    samples: int = 1,
    seed: int = 0,
) -> RolloutBatch:
    """The scored responses of the actor's *current* weights (a torch engine over its own
    model, even when its generator lags behind) to ``examples``, ``samples`` per prompt
    (greedy for 1)."""
    from rpeg.runtime import stages
    from rpeg.runtime.engines.torch_engine import TorchEngine
    from rpeg.runtime.parallel_layout import current_model

    w = copy.copy(actor)
    w.engine = TorchEngine(
        current_model(actor),  # the LM, or a whole copy of a pipelined one's stages
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        compute_dtype=getattr(actor, "compute_dtype", torch.float32),
    )
    params = actor.sampling_params(greedy=samples == 1)
    mt = getattr(actor, "multiturn", None)  # set by build_roles for multi-turn tasks
    parts = []
    for i in range(0, len(examples), CHUNK_PROMPTS):
        chunk = list(examples[i : i + CHUNK_PROMPTS])
        if mt is not None:
            from rpeg.runtime.envs.rollout import multiturn_rollout

            batch, _ = multiturn_rollout(
                w, chunk, samples, mt, prompt_template=prompt_template, params=params, seed=seed
            )
        else:
            batch, _ = stages.generate_stage(
                w, chunk, samples, prompt_template=prompt_template, params=params, seed=seed + i
            )
        batch, _ = stages.reward_stage(batch, rewards)
        parts.append(batch)
    return RolloutBatch.concat(parts)


def _figures(correct: list[float], reward: list[float], k: int) -> dict[str, float]:
    prompts = len(correct) // k
    out = {
        "accuracy": sum(correct) / len(correct),
        "reward": sum(reward) / len(reward),
    }
    if k > 1:
        hit = [any(c >= 1.0 for c in correct[p * k : (p + 1) * k]) for p in range(prompts)]
        out[f"pass@{k}"] = sum(hit) / prompts
    return out


def batch_metrics(batch: RolloutBatch, samples: int = 1) -> dict[str, float]:
    """``val/<metric>`` and ``val/<source>/<metric>`` of a scored validation batch (rows in
    groups of ``samples``, as generated)."""
    if not batch.size:
        return {}
    correct = [float(x) for x in batch.correct.tolist()]
    reward = [float(x) for x in batch.rewards.tolist()]
    out = {PREFIX + k: v for k, v in _figures(correct, reward, samples).items()}
    out[COUNT] = float(batch.size // samples)
    sources = batch.data_sources or [""] * batch.size
    for src in dict.fromkeys(s for s in sources if s):
        idx = [i for i, s in enumerate(sources) if s == src]
        figs = _figures([correct[i] for i in idx], [reward[i] for i in idx], samples)
        out.update({f"{PREFIX}{src}/{k}": v for k, v in figs.items()})
    return out


def validation_metrics(
    actor: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    rewards: Any,
    prompt_template: str,
    *,
    samples: int = 1,
    seed: int = 0,
) -> dict[str, float]:
    """:func:`batch_metrics` of :func:`validation_batch`; ``{}`` without examples."""
    if not examples:
        return {}
    batch = validation_batch(
        actor, tokenizer, examples, rewards, prompt_template, samples=samples, seed=seed
    )
    return batch_metrics(batch, samples)


def accuracy_of(metrics: Mapping[str, float]) -> float:
    """The overall accuracy of validation metrics (NaN when nothing was validated)."""
    return float(metrics.get(PREFIX + "accuracy", math.nan))


def sources_of(metrics: Mapping[str, float]) -> list[str]:
    """The data sources named in validation metrics, in order."""
    tail = "/accuracy"
    keys = [k for k in metrics if k.startswith(PREFIX) and k.endswith(tail)]
    return [k[len(PREFIX) : -len(tail)] for k in keys if k != PREFIX + "accuracy"]


def val_line(metrics: Mapping[str, float], when: str) -> str:
    """``validation after step 5: accuracy 0.312 on 64 prompts (openai/gsm8k 0.300, ...)``."""
    if not metrics:
        return f"validation {when}: no held-out prompts"
    line = (
        f"validation {when}: accuracy {accuracy_of(metrics):.3f} "
        f"on {int(metrics.get(COUNT, 0))} prompts"
    )
    passes = sorted(k for k in metrics if k.startswith(PREFIX + "pass@"))
    for k in passes:
        line += f", {k[len(PREFIX) :]} {metrics[k]:.3f}"
    srcs = sources_of(metrics)
    if srcs:
        line += " (" + ", ".join(f"{s} {metrics[f'{PREFIX}{s}/accuracy']:.3f}" for s in srcs) + ")"
    return line


def due(step: int, steps: int, every: int | None) -> bool:
    """Whether the run validates after ``step`` (1-based) of ``steps``: every ``every`` steps
    (``runtime.val_every``; 0/None: never in between) and after the last."""
    return step >= steps or bool(every and step % every == 0)
