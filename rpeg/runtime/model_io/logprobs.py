"""Memory-lean per-token log-probs: :func:`lm_logprobs` runs a causal LM and returns the log-probs
of given labels computed chunk by chunk inside the LM head (:class:`TokenLogprobHead`), so the
full-vocabulary fp32 logits of a micro-batch never exist at once. The computation stays inside
the LM's own ``forward``: FSDP2's hooks on the LM gather and reduce the head's (often tied)
weight as for any other forward."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rpeg import defaults


@dataclass
class LogprobRequest:
    """What :class:`TokenLogprobHead` computes on the next forward instead of logits.

    ``labels [B,R]``: the tokens the last ``R`` kept positions predict (the head sees
    ``R + 1`` positions and drops the last); ``None`` returns logits as usual (only
    ``capture``). Filled by the head: ``logprobs [B,R]``, ``entropy [B,R]`` or None,
    ``hidden [B,R+1,H]`` (post-norm hidden states, when ``capture``)."""

    labels: torch.Tensor | None = None
    temperature: float = defaults.TEMPERATURE
    with_entropy: bool = False
    entropy_grad: bool = False
    chunk_positions: int | None = None
    capture: bool = False
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


class TokenLogprobHead(nn.Linear):
    """An ``nn.Linear`` LM head that, while a :class:`LogprobRequest` is set, returns the
    requested tokens' log-probs ``[B,R]`` computed in sequence chunks
    (:func:`rpeg.runtime.algorithms.chunked_token_logprobs`) instead of ``[B,T,V]`` logits.
    Installed by class swap on the loaded head (:func:`install_logprob_head`), so the weight
    and its tying to the embeddings are untouched."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        req: LogprobRequest | None = self.__dict__.get("_rpeg_request")
        if req is None:
            return super().forward(hidden)
        if req.capture:
            req.hidden = hidden
        if req.labels is None:
            return super().forward(hidden)
        from rpeg.runtime.algorithms import chunked_token_logprobs

        lp, ent = chunked_token_logprobs(
            hidden[:, :-1],
            self.weight,
            req.labels,
            req.temperature,
            bias=self.bias,
            with_entropy=req.with_entropy,
            entropy_grad=req.entropy_grad,
            chunk_positions=req.chunk_positions,
        )
        req.logprobs, req.entropy = lp, ent
        return lp


def install_logprob_head(lm) -> TokenLogprobHead:
    """Turn ``lm.lm_head`` (an ``nn.Linear``) into a :class:`TokenLogprobHead` in place."""
    head = lm.lm_head
    if not isinstance(head, TokenLogprobHead):
        if type(head) is not nn.Linear:
            raise TypeError(f"LM head is {type(head).__name__}, expected nn.Linear")
        head.__class__ = TokenLogprobHead
    return head


def lm_logprobs(
    lm,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor | None,
    request: LogprobRequest | None = None,
    keep: torch.Tensor | None = None,
    **forward_kw,
) -> LogprobRequest:
    """One forward of ``lm`` over ``input_ids [B,P+R]`` keeping the last ``R + 1`` positions
    (``R = labels.shape[1]``, or ``request.extra["keep"]`` without labels), or the positions
    ``keep`` indexes (a packed row, rpeg.runtime.packing: the ``R`` positions that predict
    the labels, then one more); returns the
    filled ``request`` (log-probs of ``labels`` under ``softmax(logits / temperature)``,
    entropy and hidden states as asked). A training forward (grad enabled) of a
    mixture-of-experts model also returns its router's terms in ``request.extra["router"]``
    (rpeg.runtime.model_io.moe: the loss to add, the metrics). ``forward_kw`` go to the
    forward (a packed row's, rpeg.runtime.packing.packed_forward)."""
    req = request or LogprobRequest()
    req.labels = labels
    if keep is None:
        keep = labels.shape[1] + 1 if labels is not None else int(req.extra["keep"])
    head = install_logprob_head(lm)
    head.__dict__["_rpeg_request"] = req
    from rpeg.runtime.model_io import moe

    # a training forward of a mixture-of-experts model: its router's load-balancing loss
    kw = {"output_router_logits": True} if torch.is_grad_enabled() and moe.routes(lm) else {}
    try:
        out = lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=keep,
            use_cache=False,
            **kw,
            **forward_kw,
        )
    finally:
        head.__dict__.pop("_rpeg_request", None)
    if labels is None:
        req.extra["logits"] = out.logits
    if kw:
        req.extra["router"] = moe.capture(lm, out, attention_mask)
    return req
