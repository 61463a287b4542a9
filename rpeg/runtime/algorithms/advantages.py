"""Advantage estimators as pure tensor functions.

Notation: ``B`` samples (responses), ``T`` response tokens, ``K`` samples per prompt (a group;
groups are contiguous: samples ``g*K .. g*K+K-1`` share prompt ``g``), ``mask`` is 1 on real
response tokens and 0 on padding.
"""

from __future__ import annotations

import torch

from rpeg import defaults
from rpeg.runtime.parallel import LOCAL, RankReduce


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [B] with B divisible by group_size={group_size}; got {tuple(rewards.shape)}"
        )
    return rewards.float().view(-1, group_size)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` with the unbiased group std;
    ``normalize_std=False`` gives Dr.GRPO (Liu et al. 2025, arXiv:2503.20783): ``A_i = r_i - mean_g(r)``.

    rewards ``[B]`` -> advantages ``[B]`` (broadcast over tokens by the caller).
    """
    g = _groups(rewards, group_size)
    adv = g - g.mean(dim=1, keepdim=True)
    if normalize_std:
        std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(g)
        adv = adv / (std + eps)
    return adv.view(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019).

    ``A_i = r_i - 1/(K-1) * sum_{j != i} r_j``.  rewards ``[B]`` -> ``[B]``.
    """
    if group_size < 2:
        raise ValueError("RLOO needs samples_per_prompt >= 2")
    g = _groups(rewards, group_size)
    baseline = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    return (g - baseline).view(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce: RankReduce = LOCAL,
) -> torch.Tensor:
    """Normalize ``x`` to zero mean / unit (biased) variance over the masked entries.

    ``x, mask: [B,T]``. With a data-parallel ``reduce`` the mean and variance are over the
    masked entries of *all* ranks (sums all-reduced in float64), not this rank's shard.
    """
    m = mask.to(torch.float64)
    xd = x.to(torch.float64)
    t = reduce.sum(torch.stack([(xd * m).sum(), m.sum()]))
    n = t[1].clamp(min=1.0)
    mean = t[0] / n
    var = reduce.sum((((xd - mean) ** 2) * m).sum().reshape(1))[0] / n
    out = (xd - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return (out * m).to(x.dtype)


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence reward on its last response token: ``[B], [B,T] -> [B,T]``."""
    mask = mask.long()
    last = (mask.sum(-1) - 1).clamp(min=0)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=rewards.device)
    out.scatter_(1, last[:, None], rewards.float()[:, None])
    return out * mask


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = defaults.KL_COEF,
    gamma: float = defaults.GAMMA,
    reduce: RankReduce = LOCAL,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): token returns, then batch normalization.

    Token reward ``r_t = -kl_coef * kl_t`` plus the outcome reward on the last token;
    return ``G_t = sum_{s>=t} gamma^(s-t) r_s``; advantage = ``G`` whitened over all response
    tokens of the batch (mean and biased std of the masked tokens).

    rewards ``[B]``, mask ``[B,T]``, kl ``[B,T]`` or None -> advantages ``[B,T]``.
    """
    tok = outcome_token_rewards(rewards, mask)
    if kl is not None and kl_coef:
        tok = tok - kl_coef * kl.float() * mask
    returns = torch.zeros_like(tok)
    running = torch.zeros(tok.shape[0], dtype=tok.dtype, device=tok.device)
    for t in reversed(range(tok.shape[1])):
        running = tok[:, t] + gamma * running
        returns[:, t] = running
    return masked_whiten(returns, mask, reduce=reduce)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = defaults.GAMMA,
    lam: float = defaults.GAE_LAMBDA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438) as in PPO-RLHF.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` after the last token = 0),
    ``A_t = delta_t + gamma * lam * A_{t+1}``, returns ``R_t = A_t + V_t``.

    token_rewards, values, mask ``[B,T]`` -> (advantages ``[B,T]``, returns ``[B,T]``), zero on padding.
    """
    m = mask.float()
    v = values.float() * m
    r = token_rewards.float() * m
    adv = torch.zeros_like(r)
    next_v = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    next_a = torch.zeros_like(next_v)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_v - v[:, t]
        a = delta + gamma * lam * next_a
        # padding positions pass the future through untouched (they are after the end anyway)
        a = torch.where(m[:, t] > 0, a, next_a)
        adv[:, t] = a
        next_v = torch.where(m[:, t] > 0, v[:, t], next_v)
        next_a = a
    adv = adv * m
    returns = (adv + v) * m
    return adv, returns
