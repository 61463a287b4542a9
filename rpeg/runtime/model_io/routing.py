"""Routing record and replay for mixture-of-experts models (issue 40 item 4, the mechanism).

MoE RL drifts when the trainer routes a token to other experts than the rollout did: the
log-probs it trains on are not the ones it sampled from. :class:`RouteRecorder` records the
top-k experts every router of a transformers MoE model chose, per forward (``[layers,
tokens, k]``); :func:`replaying` makes the routers choose given experts instead (the model's
own routing code runs, with ``torch.topk`` answering the recorded indices and the values at
them, so the routing weights and their gradient are the router's own on those experts);
:func:`routing_mismatch` is the share of (layer, token) pairs whose expert sets differ.

In a run (``algorithm.routing_replay``, docs/models.md "Routing record and replay"): the
torch engine records its decode's routes with a :class:`RouteRecorder`, the rollout batch
carries them (``RolloutBatch.routes``) and the policy's forwards go through a
:class:`RouteReplay` installed on its routers, which replays them on the response tokens
and measures :func:`routing_mismatch`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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


class RouteReplay:
    """Installed on every router of ``model`` for a run: each forward's top-k goes through
    it. :meth:`set` gives the next forwards recorded experts ``routes`` (``[layers, tokens,
    k]``) for the tokens ``where`` (``[tokens]`` bool) keeps, replayed when ``replay`` (the
    router's own choice elsewhere); ``set(None)`` leaves every router to its own choice.
    After a forward, :attr:`own` holds what each router chose itself and :attr:`used` what
    the forward ran with (``[layers, tokens, k]``). The routes stay set until the next
    :meth:`set`: a backward that recomputes the forward (activation checkpointing) routes as
    the forward did."""

    def __init__(self, model: nn.Module):
        self._routers = routers(model)
        if not self._routers:
            raise ValueError("the model has no top-k routers (not a mixture-of-experts model)")
        self.routes: torch.Tensor | None = None
        self.where: torch.Tensor | None = None
        self.replay = False
        self._own: list[torch.Tensor | None] = [None] * len(self._routers)
        self._used: list[torch.Tensor | None] = [None] * len(self._routers)
        for i, r in enumerate(self._routers):
            cls_forward = type(r).forward

            def forward(*args, _f=cls_forward, _r=r, _i=i, **kw):
                real = torch.topk
                torch.topk = self._topk(_i, real)
                try:
                    return _f(_r, *args, **kw)
                finally:
                    torch.topk = real

            r.forward = forward

    def remove(self) -> None:
        for r in self._routers:
            r.__dict__.pop("forward", None)

    def set(
        self, routes: torch.Tensor | None, where: torch.Tensor | None = None, replay: bool = False
    ) -> None:
        if routes is not None and routes.shape[0] != len(self._routers):
            raise ValueError(
                f"routes for {routes.shape[0]} routers, the model has {len(self._routers)}"
            )
        self.routes, self.where, self.replay = routes, where, replay

    @property
    def own(self) -> torch.Tensor:
        return torch.stack([t for t in self._own if t is not None])

    @property
    def used(self) -> torch.Tensor:
        return torch.stack([t for t in self._used if t is not None])

    def _topk(self, i: int, real):
        def topk(input, k, dim=-1, largest=True, sorted=True, **kw):  # noqa: A002
            vals, idx = real(input, k, dim=dim, largest=largest, sorted=sorted, **kw)
            self._own[i] = idx.detach()
            if self.replay and self.routes is not None:
                rec = self.routes[i].to(idx.device)
                if rec.shape != idx.shape:
                    raise ValueError(
                        f"replayed routes {tuple(rec.shape)} do not match the router's "
                        f"{tuple(idx.shape[:-1])} tokens x top-{k}"
                    )
                keep = self.where.to(idx.device).reshape(-1, 1).bool()
                idx = torch.where(keep, rec.to(idx.dtype), idx)
                vals = input.gather(dim, idx)
            self._used[i] = idx.detach()
            return torch.return_types.topk((vals, idx))

        return topk


def replay_inputs(
    routes: torch.Tensor, response_mask: torch.Tensor, prompt_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's recorded ``routes [b, R, L, k]`` (entry ``i``: input position ``P - 1 + i``)
    as one forward's ``([L, b * (P + R), k], where [b * (P + R)])`` over ``[b, P + R]``
    inputs: the recorded experts on the response tokens' positions ``response_mask`` keeps,
    zeros (not replayed) elsewhere."""
    b, r, layers, k = routes.shape
    p = prompt_width
    full = torch.zeros((layers, b, p + r, k), dtype=torch.long, device=routes.device)
    full[:, :, p - 1 : p - 1 + r] = routes.permute(2, 0, 1, 3).long()
    where = torch.zeros((b, p + r), dtype=torch.bool, device=routes.device)
    where[:, p - 1 : p - 1 + r] = response_mask.bool()
    return full.reshape(layers, b * (p + r), k), where.reshape(-1)


def response_routes(
    forward_routes: torch.Tensor, b: int, prompt_width: int, r: int
) -> torch.Tensor:
    """``[L, b * (P + R), k]`` of one forward cut to the response tokens' positions
    (``P - 1 .. P + R - 2``), laid out as :func:`replay_inputs` reads them: ``[L, b * R, k]``."""
    layers, _, k = forward_routes.shape
    per = forward_routes.reshape(layers, b, -1, k)[:, :, prompt_width - 1 : prompt_width - 1 + r]
    return per.reshape(layers, b * r, k)


def replay_metrics(
    replay: RouteReplay,
    routes: torch.Tensor,
    response_mask: torch.Tensor,
    prompt_width: int,
    packed: Any = None,
) -> dict[str, float]:
    """After a forward through ``replay``: ``routing_mismatch``, the share of (layer, response
    token) pairs whose experts in the forward differ from the rollout's ``routes [b, R, L,
    k]``; when replaying, also ``routing_mismatch_unreplayed``, the same for the experts the
    routers chose themselves (what the forward would have used without replay, given the
    replayed earlier layers). ``packed`` (a rpeg.runtime.packing.Packed): the forward ran
    the micro-batch packed; its routes are laid back out padded first."""
    b, r, layers, k = routes.shape
    rec = routes.permute(2, 0, 1, 3).reshape(layers, b * r, k).long()
    mask = response_mask.reshape(-1)

    def laid_out(t: torch.Tensor) -> torch.Tensor:
        return t if packed is None else packed.padded(t, dim=1)

    used = response_routes(laid_out(replay.used), b, prompt_width, r).to(rec.device)
    out = {"routing_mismatch": routing_mismatch(used, rec, mask)}
    if replay.replay:
        own = response_routes(laid_out(replay.own), b, prompt_width, r).to(rec.device)
        out["routing_mismatch_unreplayed"] = routing_mismatch(own, rec, mask)
    return out
