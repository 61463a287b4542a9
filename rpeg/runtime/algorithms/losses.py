"""Losses as pure tensor functions. ``B`` samples, ``T`` response tokens, ``V`` vocabulary.

All per-token quantities are ``[B, T]`` with a 0/1 ``mask``; :func:`aggregate` turns a
``[B, T]`` loss into a scalar (token-level vs sequence-level).
"""

from __future__ import annotations

import torch

from rpeg import defaults
from rpeg.runtime.algorithms.advantages import masked_mean

AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean") -> torch.Tensor:
    """``[B,T] -> scalar``.

    * ``token_mean``: ``sum(l*m) / sum(m)`` -- every token weighs the same (DAPO, Yu et al. 2025,
      arXiv:2503.14476).
    * ``seq_mean_token_mean``: ``mean_b( sum_t l*m / sum_t m )`` -- GRPO's original per-sequence mean.
    * ``seq_mean_token_sum``: ``mean_b( sum_t l*m )`` -- Dr.GRPO-style sum (no length normalization).
    """
    m = mask.to(loss.dtype)
    if mode == "token_mean":
        return (loss * m).sum() / m.sum().clamp(min=1.0)
    if mode == "seq_mean_token_sum":
        return (loss * m).sum(-1).mean()
    if mode == "seq_mean_token_mean":
        return ((loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: {AGGREGATIONS}")


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = defaults.TEMPERATURE
) -> torch.Tensor:
    """``logits [B,T,V]``, ``labels [B,T]`` -> ``log softmax(logits/temperature)[labels]`` ``[B,T]``."""
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    return torch.gather(logits.log_softmax(-1), -1, labels[..., None]).squeeze(-1)


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = defaults.TEMPERATURE
) -> torch.Tensor:
    """``[B,T,V] -> [B,T]``: ``H = logsumexp(z) - sum softmax(z) * z``."""
    z = logits.float()
    if temperature and temperature != 1.0:
        z = z / temperature
    p = z.softmax(-1)
    return torch.logsumexp(z, -1) - (p * z).sum(-1)


#: fp32 elements of one chunk's logits ``[rows, positions, V]`` in :func:`chunked_token_logprobs`
#: (64 Mi elements = 256 MiB); a chunk spans as many sequence positions as fit.
LOGPROB_CHUNK_ELEMENTS = 64 * 1024 * 1024


def _chunk_logprobs(
    hidden, weight, bias, labels, temperature: float, with_entropy: bool, entropy_grad: bool = True
):
    z = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature and temperature != 1.0:
        z = z / temperature
    logp = z.log_softmax(-1)
    lp = torch.gather(logp, -1, labels[..., None]).squeeze(-1)
    if not with_entropy:
        return lp, lp.new_zeros(())
    if entropy_grad:
        return lp, -(logp.exp() * logp).sum(-1)
    with torch.no_grad():  # a metric: no graph of [rows, positions, V] for it
        return lp, -(logp.exp() * logp).sum(-1)


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = defaults.TEMPERATURE,
    *,
    bias: torch.Tensor | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_positions: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) straight from the LM head's input, never holding
    the full-vocabulary fp32 logits of the whole ``[B,T]`` at once.

    ``hidden [B,T,H]`` (post-norm hidden states of the positions that predict ``labels``),
    ``weight [V,H]`` (the LM head), ``labels [B,T]`` -> (``log softmax(h W^T / temperature)
    [labels]`` ``[B,T]``, entropy ``[B,T]`` or None). The sequence is cut into chunks of
    ``chunk_positions`` positions (default: as many as keep one chunk's fp32 logits under
    :data:`LOGPROB_CHUNK_ELEMENTS`); with autograd on and more than one chunk, each chunk is
    recomputed in backward (activation checkpointing) so only its hidden slice is kept. One
    chunk is not recomputed: its backward would hold the same logits again at the same
    moment (the peak is the same), and the recompute cost a third more of the head's time
    (measured: vocabulary 32,000, 128 x 12 positions, fp32 CPU, forward + backward 1246 vs
    877 ms). Entropy is computed only
    with ``with_entropy`` and is differentiated only with ``entropy_grad`` (the loss uses it
    only when the entropy coefficient is non-zero)."""
    b, t = labels.shape
    v = weight.shape[0]
    if chunk_positions is None:
        chunk_positions = max(1, LOGPROB_CHUNK_ELEMENTS // max(1, b * v))
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    lps, ents = [], []
    for s in range(0, t, chunk_positions):
        h = hidden[:, s : s + chunk_positions]
        y = labels[:, s : s + chunk_positions]
        if grad and chunk_positions < t:
            from torch.utils.checkpoint import checkpoint

            lp, ent = checkpoint(
                _chunk_logprobs,
                h,
                weight,
                bias,
                y,
                temperature,
                with_entropy,
                entropy_grad,
                use_reentrant=False,
            )
        else:
            lp, ent = _chunk_logprobs(h, weight, bias, y, temperature, with_entropy, entropy_grad)
        lps.append(lp)
        if with_entropy:
            ents.append(ent if entropy_grad else ent.detach())
    lp = torch.cat(lps, dim=1) if lps else hidden.new_zeros((b, 0), dtype=torch.float32)
    ent = None
    if with_entropy:
        ent = torch.cat(ents, dim=1) if ents else lp.new_zeros((b, 0))
    return lp, ent


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token KL(pi || ref) estimators on samples from pi (Schulman 2020, "Approximating KL
    divergence", http://joschu.net/blog/kl-approx.html). With ``d = ref - logp``:

    * ``k1 = -d = logp - ref`` (unbiased, high variance, can be negative)
    * ``k2 = d^2 / 2`` (biased, low variance)
    * ``k3 = exp(d) - d - 1`` (unbiased, >= 0; used by GRPO)

    ``[B,T], [B,T] -> [B,T]``.
    """
    d = ref_logprobs.float() - logprobs.float()
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; allowed: k1, k2, k3")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = defaults.CLIP_LOW,
    clip_high: float = defaults.CLIP_HIGH,
    dual_clip: float | None = None,
    aggregation: str = "token_mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate (PPO, Schulman et al. 2017, arXiv:1707.06347).

    ``ratio = exp(logp - old)``; per-token loss ``l = max(-A*ratio, -A*clip(ratio, 1-clip_low, 1+clip_high))``
    -- asymmetric bounds are DAPO's clip-higher (arXiv:2503.14476). Dual-clip (Ye et al. 2020,
    arXiv:1912.09729): for ``A < 0``, ``l = min(l, -A * dual_clip)``.

    Off-policy correction for samples the rollout engine drew (an older policy version, or
    other numerics): ``old_logprobs`` plays the proximal policy of decoupled PPO (Hilton et
    al. 2022, arXiv:2110.00641; AReaL, Fu et al. 2025, arXiv:2505.24298) and each token's
    loss is multiplied by ``is_weights`` ``[B,T]`` (detached; 0 drops the token), the
    importance weights of :func:`rpeg.runtime.algorithms.mismatch.correction_weights`
    (truncated IS: IMPALA, Espeholt et al. 2018; Yao et al. 2025 "TIS"; masked IS; IcePop).

    logprobs, old_logprobs, advantages, mask ``[B,T]`` (advantages may be ``[B]`` -> broadcast)
    -> (scalar loss, metrics: clip_frac, dual_clip_frac, approx_kl).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    adv = advantages.float()
    log_ratio = logprobs.float() - old_logprobs.float()
    ratio = torch.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    clipped = (loss2 > loss1).float()
    dual_frac = torch.zeros((), device=loss.device)
    if dual_clip is not None:
        loss3 = -adv * dual_clip
        use3 = (adv < 0) & (loss3 < loss)
        dual_frac = masked_mean(use3.float(), mask)
        loss = torch.where(adv < 0, torch.minimum(loss, loss3), loss)
    if is_weights is not None:
        loss = loss * is_weights.detach().to(loss.dtype)
    out = aggregate(loss, mask, aggregation)
    with torch.no_grad():
        metrics = {
            "clip_frac": float(masked_mean(clipped, mask)),
            "dual_clip_frac": float(dual_frac),
            "approx_kl": float(masked_mean(0.5 * log_ratio**2, mask)),
        }
    return out, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = defaults.VALUE_CLIP,
    aggregation: str = "token_mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO2 / OpenAI baselines): ``0.5 * max((V-R)^2, (V_clip-R)^2)`` with
    ``V_clip = old + clamp(V - old, -clip, clip)``; ``clip=None`` -> ``0.5 * (V-R)^2``.

    values, old_values, returns, mask ``[B,T]`` -> (scalar, {"vf_clip_frac"}).
    """
    v = values.float()
    l1 = (v - returns.float()) ** 2
    if clip is None:
        loss = 0.5 * l1
        frac = 0.0
    else:
        vc = old_values.float() + torch.clamp(v - old_values.float(), -clip, clip)
        l2 = (vc - returns.float()) ** 2
        loss = 0.5 * torch.maximum(l1, l2)
        frac = float(masked_mean((l2 > l1).float(), mask))
    return aggregate(loss, mask, aggregation), {"vf_clip_frac": frac}
