"""Value heads on a causal LM's trunk: :class:`CriticModel` (a separate critic: trunk + scalar
head) and :class:`ActorCritic` (the actor's trunk shared: one forward gives logits and values)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rpeg.runtime.model_io.logprobs import LogprobRequest, lm_logprobs


def trunk_of(model):
    """The decoder trunk (no LM head) of a causal LM."""
    return getattr(model, model.base_model_prefix)


class ValueHead(nn.Module):
    """Scalar value per position: ``hidden [B, T, H] -> values [B, T]``."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)


def _beside(head: nn.Module, lm) -> nn.Module:
    """``head`` on the device and in the dtype of ``lm``'s parameters."""
    p = next(lm.parameters(), None)
    return head if p is None else head.to(device=p.device, dtype=p.dtype)


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # [B, T, V]
    values: torch.Tensor | None  # [B, T]


class CriticModel(nn.Module):
    """A separate critic: a causal-LM trunk plus a value head (the LM head is dropped)."""

    def __init__(self, lm):
        super().__init__()
        self.trunk = trunk_of(lm)
        self.trunk_prefix = lm.base_model_prefix  # the trunk's names in the LM's state dict
        self.config = lm.config
        self.value_head = _beside(ValueHead(lm.config.hidden_size), lm)

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        keep_last: int | torch.Tensor = 0,
        **forward_kw,
    ) -> ModelOutput:
        """``keep_last > 0``: values of the last ``keep_last`` positions only; a tensor: of
        the positions it indexes (a packed row, rpeg.runtime.packing; ``forward_kw`` from
        its ``packed_forward``)."""
        h = self.trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **forward_kw,
        ).last_hidden_state
        if isinstance(keep_last, torch.Tensor):
            h = h[:, keep_last]
        elif keep_last:
            h = h[:, -keep_last:]
        return ModelOutput(logits=None, values=self.value_head(h).float())


class ActorCritic(nn.Module):
    """Actor and critic on one trunk: one forward gives logits ``[B,T,V]`` and values ``[B,T]``."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        self.config = lm.config
        self.value_head = _beside(ValueHead(lm.config.hidden_size), lm)

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, keep_last: int = 0
    ) -> ModelOutput:
        """``keep_last > 0``: logits and values of the last ``keep_last`` positions only.
        Runs ``self.lm`` (not its trunk and head separately) so that FSDP's hooks on it fire."""
        req = lm_logprobs(
            self.lm,
            input_ids,
            attention_mask,
            position_ids,
            None,
            LogprobRequest(capture=True, extra={"keep": keep_last}),
        )
        return ModelOutput(logits=req.extra["logits"], values=self.value_head(req.hidden).float())

    def logprobs_and_values(
        self,
        input_ids,
        attention_mask,
        position_ids,
        labels,
        request: LogprobRequest,
        keep=None,
        **forward_kw,
    ) -> tuple[LogprobRequest, torch.Tensor]:
        """Chunked log-probs of ``labels [B,R]`` and values ``[B,R]`` from one forward
        (``keep``, ``forward_kw``: as :func:`rpeg.runtime.model_io.lm_logprobs`)."""
        request.capture = True
        req = lm_logprobs(
            self.lm, input_ids, attention_mask, position_ids, labels, request, keep, **forward_kw
        )
        return req, self.value_head(req.hidden[:, :-1]).float()
