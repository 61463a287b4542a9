"""Rollout/trainer mismatch: how far the log-probs the generation engine sampled with are
from the trainer's, and the loss weights that correct for it. Pure tensor functions.

Notation: ``[B,T]`` response tokens with a 0/1 ``mask``; ``train`` the trainer's log-probs
of the sampled tokens at the weights before the step's update (the old / proximal policy),
``rollout`` the engine's (the behaviour policy); per token ``r = train - rollout`` and the
ratio ``rho = exp(r) = pi_train / pi_rollout``.

* :func:`mismatch_metrics` -- what every step reports (``logprob_mismatch_*``).
* :func:`correction_weights` -- the per-token loss weight of each
  ``algorithm.rollout_correction.mode`` (0 = the token is dropped).

Sources (facts, not code): truncated IS, Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (token-level, cap C); sequence-level and masked
IS, Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" and verl's rollout-correction docs (docs/algo/rollout_corr.md:
IS threshold 2.0, rejection lower bound = 1/upper, sequence products bounded in log space);
IcePop, Ling Team 2025, "Every Step Evolves" (Ring-1T, arXiv:2510.18855): the mask
``M(k) = k`` for ``k`` in ``[alpha, beta]``, else 0.
"""

from __future__ import annotations

import torch

from rpeg.runtime.parallel import LOCAL, RankReduce

#: the metrics :func:`mismatch_metrics` returns (every step, both runtimes, both engines)
MISMATCH_KEYS = (
    "logprob_mismatch_mean",
    "logprob_mismatch_k3",
    "logprob_mismatch_frac_over",
    "logprob_mismatch_max",
)
CORRECTION_MODES = ("none", "token_tis", "seq_tis", "token_mis", "seq_mis", "icepop")
#: log-ratios are bounded to +-20 before ``exp`` (verl's safety bound, ``exp(20)`` ~ 5e8): a
#: sequence's summed log-ratio can be in the hundreds
LOG_RATIO_BOUND = 20.0


def mismatch_sums(
    train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, *, threshold: float = 0.2
) -> torch.Tensor:
    """``[5]`` float64 over the masked tokens: sum ``|r|``, sum ``exp(r) - 1 - r``, tokens
    with ``|exp(r) - 1| > threshold``, tokens, max ``|r|`` -- what :func:`mismatch_from_sums`
    turns into metrics; sums of several micro-batches add (the max: ``maximum``)."""
    m = mask.to(torch.float64)
    r = (train.detach().to(torch.float64) - rollout.to(torch.float64)) * m
    rb = r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    over = ((torch.exp(rb) - 1.0).abs() > threshold).to(torch.float64) * m
    top = r.abs().max() if r.numel() else r.new_zeros(())
    return torch.stack(
        [r.abs().sum(), ((torch.exp(rb) - 1.0 - rb) * m).sum(), over.sum(), m.sum(), top]
    ).cpu()


def add_sums(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two :func:`mismatch_sums` combined (sums added, the max kept)."""
    return torch.cat([a[:4] + b[:4], torch.maximum(a[4:], b[4:])])


def mismatch_from_sums(sums: torch.Tensor, reduce: RankReduce = LOCAL) -> dict[str, float]:
    """The ``logprob_mismatch_*`` metrics of :func:`mismatch_sums` (all-reduced over the
    data-parallel group with ``reduce``: every rank calls it). No token: all 0."""
    total = reduce.sum(sums[:4].clone())
    biggest = reduce.max(sums[4:].clone())
    n = float(total[3])
    if n == 0:
        return dict.fromkeys(MISMATCH_KEYS, 0.0)
    return {
        "logprob_mismatch_mean": float(total[0]) / n,
        "logprob_mismatch_k3": float(total[1]) / n,
        "logprob_mismatch_frac_over": float(total[2]) / n,
        "logprob_mismatch_max": float(biggest[0]),
    }


def mismatch_metrics(
    train: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
    *,
    threshold: float = 0.2,
    reduce: RankReduce = LOCAL,
) -> dict[str, float]:
    """The rollout/trainer mismatch over the masked tokens (all of a data-parallel group's
    with ``reduce``: sums are all-reduced, so every rank reports the group's figures):

    * ``logprob_mismatch_mean``: ``mean |r|``;
    * ``logprob_mismatch_k3``: ``mean (exp(r) - 1 - r)``, Schulman's k3 estimator on tokens
      sampled from the rollout policy: it estimates ``KL(pi_rollout || pi_train)`` (>= 0);
    * ``logprob_mismatch_frac_over``: share of tokens with ``|exp(r) - 1| > threshold``;
    * ``logprob_mismatch_max``: ``max |r|``.

    ``train``, ``rollout``, ``mask`` ``[B,T]``. No token: all 0."""
    return mismatch_from_sums(mismatch_sums(train, rollout, mask, threshold=threshold), reduce)


def correction_weights(
    train: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    low: float | None = None,
    high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token loss weights ``w [B,T]`` (detached, 0 on padding) of a correction ``mode``:

    * ``none``: ``w = 1``;
    * ``token_tis``: ``w_t = min(rho_t, high)``;
    * ``seq_tis``: ``w_t = min(prod_s rho_s, high)`` for every token of the sequence;
    * ``token_mis`` / ``icepop``: ``w_t = rho_t`` where ``low <= rho_t <= high``, else 0;
    * ``seq_mis``: ``w_t = prod_s rho_s`` where the product is in ``[low, high]``, else 0
      (the whole sequence is dropped).

    A bound that is None is no bound. Dropped tokens stay in the loss's denominator (a
    dropped token contributes 0, as in IcePop's objective), so the micro-batch weighting of
    rpeg.runtime.updates is unchanged. Metrics: ``correction_weight_mean`` (mean ``w`` over
    the masked tokens) and ``correction_masked_frac`` (share of them dropped)."""
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction {mode!r}; allowed: {CORRECTION_MODES}")
    m = mask.to(torch.float32)
    r = (train.float() - rollout.float()).detach() * m
    if mode in ("seq_tis", "seq_mis"):
        r = r.sum(-1, keepdim=True).expand_as(r)
    r = r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rho = torch.exp(r)
    keep = torch.ones_like(rho, dtype=torch.bool)
    if mode == "none":
        w = torch.ones_like(rho)
    elif mode in ("token_tis", "seq_tis"):
        w = rho if high is None else rho.clamp(max=high)
    else:
        if low is not None:
            keep &= rho >= low
        if high is not None:
            keep &= rho <= high
        w = torch.where(keep, rho, torch.zeros_like(rho))
    w = w * m
    n = m.sum().clamp(min=1.0)
    dropped = ((~keep).float() * m).sum()
    return w, {
        "correction_weight_mean": float(w.sum() / n),
        "correction_masked_frac": float(dropped / n),
    }
