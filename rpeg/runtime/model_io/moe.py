"""Mixture-of-experts training terms, as the model defines them.

A transformers MoE causal LM (Qwen3-MoE, Mixtral, gpt-oss, Qwen3-Next, ...) returns, when its
forward is called with ``output_router_logits=True``, each MoE layer's router logits and its
load-balancing loss (``aux_loss``: the Switch-Transformer loss, Fedus et al. 2021,
arXiv:2101.03961, computed by the model's own ``load_balancing_loss_func`` over the
non-padding tokens of the attention mask). Its ``forward`` adds
``router_aux_loss_coef * aux_loss`` to the language-model loss only when given ``labels``;
the trainer computes its own loss from per-token log-probs (rpeg.runtime.model_io.logprobs),
so it adds that term itself (:func:`router_loss`), with the model's coefficient.

Metrics (:func:`router_metrics`): ``router_aux_loss`` (the model's loss, before the
coefficient) and, per MoE layer ``i``, ``expert_imbalance_l<i>``: the most-loaded expert's
share of the layer's top-k assignments over the mean share (1 = perfectly balanced, ``E`` =
every token to one expert's slot); ``expert_imbalance_max`` is the largest over layers. A
step's training metrics are means over its optimizer updates, so the step's
``expert_imbalance_max`` is the mean of each update's largest: at least the largest of the
per-layer means, more when different layers lead in different updates.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def num_experts(config: Any) -> int:
    """Routed experts per MoE layer of ``config`` (0 for a dense model)."""
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        n = getattr(config, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return 0


def routes(lm: Any) -> bool:
    """True when ``lm`` is a mixture-of-experts causal LM whose forward returns its router
    logits and load-balancing loss (``output_router_logits``)."""
    cfg = getattr(lm, "config", None)
    if cfg is None or not num_experts(cfg) or getattr(cfg, "router_aux_loss_coef", None) is None:
        return False
    return "output_router_logits" in inspect.signature(type(lm).forward).parameters


def expert_loads(router_logits, top_k: int, experts: int, mask: torch.Tensor | None):
    """``[L, E]`` top-k assignments per expert of each MoE layer's router logits
    (``[tokens, E]`` each), counting only the tokens ``mask`` (``[B, T]``) keeps."""
    rows = []
    for logits in router_logits:
        chosen = torch.topk(logits.detach().float(), top_k, dim=-1).indices  # [N, k]
        w = torch.ones(chosen.shape[0], device=chosen.device)
        if mask is not None and mask.numel() == chosen.shape[0]:
            w = mask.reshape(-1).to(chosen.device, torch.float32)
        counts = torch.zeros(experts, device=chosen.device)
        counts.scatter_add_(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        rows.append(counts)
    return torch.stack(rows) if rows else torch.zeros((0, experts))


def router_metrics(router: dict) -> dict[str, float]:
    """The logged terms of one forward's ``router`` (:func:`capture`)."""
    out: dict[str, float] = {"router_aux_loss": float(router["aux_loss"].detach())}
    loads = expert_loads(
        router["router_logits"], router["top_k"], router["experts"], router.get("mask")
    )
    worst = 0.0
    for i, counts in enumerate(loads):
        mean = float(counts.mean())
        imb = float(counts.max()) / mean if mean > 0 else 0.0
        out[f"expert_imbalance_l{i}"] = imb
        worst = max(worst, imb)
    out["expert_imbalance_max"] = worst
    return out


def router_loss(router: dict | None) -> torch.Tensor | float:
    """``router_aux_loss_coef * aux_loss`` of one forward (0 without a router)."""
    if router is None:
        return 0.0
    return router["coef"] * router["aux_loss"]


def capture(lm: Any, out: Any, attention_mask: torch.Tensor | None) -> dict | None:
    """What a forward of ``lm`` called with ``output_router_logits=True`` returned for the
    router (its loss, logits, the mask it counted and the model's coefficient), or None."""
    aux = getattr(out, "aux_loss", None)
    logits = getattr(out, "router_logits", None)
    if aux is None or not isinstance(aux, torch.Tensor) or not logits:
        return None
    cfg = lm.config
    return {
        "aux_loss": aux,
        "router_logits": tuple(logits),
        "mask": attention_mask,
        "coef": float(cfg.router_aux_loss_coef),
        "top_k": int(cfg.num_experts_per_tok),
        "experts": num_experts(cfg),
    }
