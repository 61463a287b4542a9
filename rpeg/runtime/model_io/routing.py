"""Routing record and replay for mixture-of-experts models (issue 40 item 4, the mechanism).

MoE RL drifts when the trainer routes a token to other experts than the rollout did: the
log-probs it trains on are not the ones it sampled from. :class:`RouteRecorder` records the
top-k experts every router of a transformers MoE model chose, per forward (``[layers,
tokens, k]``); :func:`replaying` makes the routers choose given experts instead (the model's
own routing code runs, with ``torch.topk`` answering the recorded indices and the values at
them, so the routing weights and their gradient are the router's own on those experts);
:func:`routing_mismatch` is the share of (layer, token) pairs whose expert sets differ.

Not yet wired into a run: the torch engine does not record its decode's routes, the batch
does not carry them and ``algorithm.routing_replay`` is not a config field (docs/models.md
"Not yet").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def routers(model: nn.Module) -> list[nn.Module]:
    """The top-k routers of a transformers MoE model, in layer order."""
    return [
        m
        for m in model.modules()
        if type(m).__name__.endswith("Router") and isinstance(getattr(m, "top_k", None), int)
    ]


class RouteRecorder:
    """While entered, records the experts each router chose (the third output of transformers'
    ``*TopKRouter``: indices ``[tokens, k]``). :meth:`routes` stacks the last forward's."""

    def __init__(self, model: nn.Module):
        self._routers = routers(model)
        self._seen: list[torch.Tensor] = []
        self._hooks: list = []

    def __enter__(self) -> RouteRecorder:
        self._seen = []
        for r in self._routers:
            self._hooks.append(r.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _hook(self, module, args, output) -> None:
        self._seen.append(output[2].detach().clone())

    def routes(self) -> torch.Tensor:
        """``[layers, tokens, k]`` of the forwards recorded (layers x forwards, in order)."""
        return torch.stack(self._seen) if self._seen else torch.empty((0, 0, 0), dtype=torch.long)

    def clear(self) -> None:
        self._seen = []


def _topk_answering(indices: torch.Tensor):
    """A ``torch.topk`` that returns ``indices`` and the input's values at them."""

    def topk(input, k, dim=-1, largest=True, sorted=True, **kw):  # noqa: A002 -- torch's names
        idx = indices.to(input.device)
        if idx.shape[-1] != k or idx.shape[:-1] != input.shape[:-1]:
            raise ValueError(
                f"replayed routes {tuple(idx.shape)} do not match the router's "
                f"{tuple(input.shape[:-1])} tokens x top-{k}"
            )
        return torch.return_types.topk((input.gather(dim, idx), idx))

    return topk


@contextlib.contextmanager
def replaying(model: nn.Module, routes: torch.Tensor) -> Iterator[None]:
    """While inside, router ``i`` of ``model`` chooses ``routes[i]`` (``[layers, tokens, k]``,
    as :meth:`RouteRecorder.routes` gives them for one forward) on its next forward."""
    rs = routers(model)
    if routes.shape[0] != len(rs):
        raise ValueError(f"routes for {routes.shape[0]} routers, the model has {len(rs)}")
    for r, idx in zip(rs, routes, strict=True):
        own = type(r).forward

        def forward(*args, _own=own, _r=r, _idx=idx, **kw):
            real = torch.topk
            torch.topk = _topk_answering(_idx)
            try:
                return _own(_r, *args, **kw)
            finally:
                torch.topk = real

        r.forward = forward
    try:
        yield
    finally:
        for r in rs:
            r.__dict__.pop("forward", None)


def routing_mismatch(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """The share of (layer, token) pairs whose top-k expert sets differ between ``a`` and ``b``
    (``[layers, tokens, k]``), over the tokens ``mask`` (``[tokens]``) keeps."""
    same = (a.sort(-1).values == b.sort(-1).values).all(-1)  # [L, N]
    keep = torch.ones_like(same) if mask is None else mask.reshape(1, -1).bool().expand_as(same)
    n = int(keep.sum())
    return float((~same & keep).sum()) / n if n else 0.0
