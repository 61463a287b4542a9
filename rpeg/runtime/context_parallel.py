"""Context (sequence) parallelism (cp) of a causal LM for training and log-prob passes.

The ``cp`` ranks of a group hold the same rows; each runs the decoder on a share of every
sequence's positions. **Load balance** (causal attention costs more late in a sequence): the
right-padded sequence is cut into ``2 cp`` equal chunks and rank ``r`` takes chunks ``r`` and
``2 cp - 1 - r`` (the "zigzag" split of Megatron-CP / ring-flash-attention), so every rank has
the same number of query-key pairs. **Exact attention**: each layer all-gathers the keys and
values (after the rotary embedding) over cp and attends its local queries to every key with the
causal mask and the padding mask of the global column order (backward: the key/value gradients
are summed over cp and each rank keeps its slice). Only the keys and values of a layer are whole
on a rank; the hidden states, MLP activations and the LM head's work are ``1/cp``.

Log-probs: each rank computes those of its own positions (the chunked LM head,
:func:`rpeg.runtime.algorithms.chunked_token_logprobs`), writes them into a zero ``[B, R]`` and
the cp ranks sum it (forward all-reduce, backward identity: Megatron's ``g``); every rank then
holds the one-process log-probs and computes the same loss, so the runtime's losses, recipes
and micro-batching are unchanged (the LM's ``forward`` is replaced, as under pipelining). The
parameters' gradients are the sums of the ranks' contributions (:class:`ContextShards`,
``sync_grads``: all-reduce sum over cp, then the mean over dp replicas). With FSDP the
parameters are sharded over all dp x cp ranks and one reduce-scatter does both
(:func:`context_fsdp`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from rpeg.errors import ConfigError, Problem

ATTENTION = "rpeg_context_parallel"
_CTX: dict[str, Any] = {}


def zigzag_columns(length: int, cp: int, rank: int) -> torch.Tensor:
    """The columns rank ``rank`` of ``cp`` holds of a sequence of ``length`` (a multiple of
    ``2 cp``): chunks ``rank`` and ``2 cp - 1 - rank`` of ``2 cp``."""
    n = length // (2 * cp)
    a, b = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(a * n, (a + 1) * n), torch.arange(b * n, (b + 1) * n)])


class _GatherSeq(torch.autograd.Function):
    """All-gather ``x [b, h, n, d]`` over the cp group along dim 2 (rank order); backward:
    the gradient summed over cp (every rank's queries used every key), this rank's slice."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.rank, ctx.n = group, rank, x.shape[2]
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g[:, :, ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n], None, None, None


class _SumOverCP(torch.autograd.Function):
    """Forward: sum over the cp group; backward: identity (each rank's loss is the whole)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def _attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **_):
    """Local queries ``[b, h, n, d]`` against the keys and values of the whole sequence."""
    c = _CTX
    k = _GatherSeq.apply(key, c["group"], c["rank"], c["size"])
    v = _GatherSeq.apply(value, c["group"], c["rank"], c["size"])
    groups = query.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, k.transpose(2, 3)) * scaling
    allowed = c["causal"][None, None] & c["key_pad"][:, None, None, :]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, v).transpose(1, 2).contiguous()
    return out, None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)


@contextlib.contextmanager
def _attention_impl(config, name: str):
    old = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = old


class _ContextParallelForward:
    """The LM's ``forward`` at cp > 1: this rank's zigzag share of each sequence through the
    decoder, the log-probs the LM head's :class:`LogprobRequest` asks for summed over cp."""

    def __init__(self, lm, group, rank: int, size: int, whole=None):
        self.lm, self.group, self.rank, self.size = lm, group, rank, size
        self.whole = whole  # the LM's own forward: a decode (logits) runs it on every position

    def __call__(
        self, input_ids=None, attention_mask=None, position_ids=None, logits_to_keep=0, **kw
    ):
        from rpeg.runtime.algorithms import chunked_token_logprobs

        lm, cp = self.lm, self.size
        req = lm.lm_head.__dict__.get("_rpeg_request")
        if (req is None or req.labels is None) and self.whole is not None:
            # a decode or a logits forward (generation): every rank holds the whole model
            # and its own rows at the generation layout, so the LM's own forward runs
            return self.whole(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                logits_to_keep=logits_to_keep,
                **kw,
            )
        if req is None or req.labels is None:
            raise RuntimeError(
                "a context-parallel LM computes log-probs of given labels only "
                "(rpeg.runtime.model_io.lm_logprobs), not logits"
            )
        b, t = input_ids.shape
        pad = -t % (2 * cp)
        if pad:  # right padding: after every real token, so causal attention never sees it
            input_ids = torch.nn.functional.pad(input_ids, (0, pad))
            attention_mask = torch.nn.functional.pad(attention_mask, (0, pad))
            position_ids = torch.nn.functional.pad(position_ids, (0, pad))
        cols = zigzag_columns(t + pad, cp, self.rank).to(input_ids.device)
        every = torch.cat([zigzag_columns(t + pad, cp, r) for r in range(cp)]).to(cols.device)
        _CTX.update(
            group=self.group,
            rank=self.rank,
            size=cp,
            causal=every[None, :] <= cols[:, None],
            key_pad=attention_mask[:, every].bool(),
        )
        base = lm.model
        x = base.embed_tokens(input_ids[:, cols])
        pos = position_ids[:, cols]
        pe = base.rotary_emb(x, position_ids=pos)
        try:
            with _attention_impl(lm.config, ATTENTION):
                for layer in base.layers[: lm.config.num_hidden_layers]:
                    x = layer(x, attention_mask=None, position_embeddings=pe, position_ids=pos)
        finally:
            _CTX.clear()
        x = base.norm(x)
        # column c predicts token c + 1: column t - R - 1 + j predicts labels[:, j]
        r = req.labels.shape[1]
        j = cols - (t - r - 1)
        keep = (j >= 0) & (j < r)
        lp, ent = chunked_token_logprobs(
            x[:, keep],
            lm.lm_head.weight,
            req.labels[:, j[keep]],
            req.temperature,
            bias=lm.lm_head.bias,
            with_entropy=req.with_entropy,
            entropy_grad=req.entropy_grad,
            chunk_positions=req.chunk_positions,
        )
        full = lp.new_zeros((b, r)).index_copy(1, j[keep], lp)
        if torch.is_grad_enabled() and x.requires_grad:
            # every rank's backward must reach every layer (the key/value gathers' backward
            # all-reduces run on all cp ranks), even with no response position held here
            full = full + 0.0 * x.sum()
        req.logprobs = _SumOverCP.apply(full, self.group)
        if ent is not None:
            e = ent.new_zeros((b, r)).index_copy(1, j[keep], ent)
            req.entropy = _SumOverCP.apply(e, self.group)
        # a ModelOutput (a pytree node), so that FSDP2's root registers its pre-backward
        # (re-gather the root's parameters) on the outputs whose backward reaches them
        from transformers.modeling_outputs import CausalLMOutputWithPast

        extra = (req.entropy,) if req.entropy is not None else None
        return CausalLMOutputWithPast(logits=req.logprobs, hidden_states=extra)


class ContextShards:
    """The role's ``shards`` at cp > 1 (the protocol :func:`rpeg.runtime.updates.
    minibatch_updates` uses): gradients summed over cp (each rank holds its positions'
    contribution), averaged over dp replicas, then clipped by the global norm."""

    def __init__(self, module, cp_group, dp_group=None):
        self.module, self.cp_group, self.dp_group = module, cp_group, dp_group

    def training_pass(self, module):
        return contextlib.nullcontext()

    def sync_grads(self) -> None:
        n = dist.get_world_size(self.dp_group) if self.dp_group is not None else 1
        for p in self.module.parameters():
            if p.grad is None:
                continue
            dist.all_reduce(p.grad, group=self.cp_group)
            if self.dp_group is not None:
                dist.all_reduce(p.grad, group=self.dp_group)
                p.grad.div_(n)

    def clip_grads(self, params, max_norm: float) -> float:
        params = [p for p in params if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0


def fsdp_layout(layout):
    """The layout a role sharded by FSDP2 over every rank of a cp x dp group holds: FSDP over
    ``dp * cp`` ranks, no cp (what checkpoints, decoding and the summary read from
    ``shards.layout``)."""
    from dataclasses import replace

    return replace(layout, dp=layout.dp * layout.cp, cp=1)


def context_fsdp(worker, layout, mesh, *, source=None, device=None) -> Any:
    """FSDP2 over ``mesh`` (1-D, the group's ``dp * cp`` ranks: the cp ranks hold the same
    parameters, so they shard them as data-parallel ranks do) of ``worker``'s LM, as
    torchtitan composes FSDP with cp. Gradients: each rank's reduce-scatter input is its
    positions' share of its dp index's gradient, so the reduction is a sum over all ranks
    divided by ``dp`` (``set_force_sum_reduction_for_comms`` + ``set_gradient_divide_factor``:
    a sum over cp, the mean over dp -- :class:`ContextShards` at replicas). A role built on
    the meta device is filled from ``source`` after sharding (each rank its slices); the
    optimizer is rebuilt over the sharded parameters. Returns the role's
    :class:`rpeg.runtime.sharding.Shards` (its ``layout``: :func:`fsdp_layout`)."""
    from torch.distributed.fsdp import FSDPModule

    from rpeg.runtime.materialize import materialize, on_meta
    from rpeg.runtime.model_io import torch_dtype
    from rpeg.runtime.parallel import process_group_reduce
    from rpeg.runtime.precision import fsdp_policy
    from rpeg.runtime.sharding import Shards, apply_fsdp

    lm = worker.lm
    meta = on_meta(lm)
    apply_fsdp(lm, mesh, mp_policy=fsdp_policy(torch_dtype(layout.dtype)))
    for m in lm.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.set_gradient_divide_factor(float(layout.dp))
    if meta:
        if source is None or device is None:
            raise ValueError("a context-parallel role built on the meta device needs a source")
        from rpeg.runtime.lora import has_lora, lora_fetch

        fetch = source.fetch
        if has_lora(lm):
            fetch = lora_fetch(fetch, worker.seed, lm)
        materialize(lm, device, fetch, "actor" if worker.trainable else "reference")
    if worker.optimizer is not None:  # over the sharded (and filled) parameters
        worker.optimizer = worker._make_optimizer()
    # a decode gathering per forward gathers over every rank of the mesh: lockstep over all
    return Shards(fsdp_layout(layout), mesh, lockstep=process_group_reduce(mesh.get_group()))


def apply_context_parallel(
    worker,
    cp_group,
    rank: int,
    size: int,
    dp_group=None,
    *,
    fsdp=None,
    source=None,
    device=None,
) -> None:
    """Run ``worker``'s (a :class:`rpeg.runtime.roles.PolicyWorker`) log-prob and training
    passes at context parallelism over ``cp_group`` (this rank is ``rank`` of ``size``).
    ``fsdp``: ``(layout, mesh)`` -- the parameters sharded by FSDP2 over the group's
    ``dp * cp`` ranks (:func:`context_fsdp`); otherwise every rank holds them whole
    (:class:`ContextShards`). Refused by name: a shared value head, a model whose attention
    is not transformers' standard (Llama/Qwen2/Qwen3) interface."""
    if getattr(worker, "shared_critic", False):
        raise ConfigError(
            [
                Problem(
                    "plan.cp",
                    "context parallelism with a shared value head (algorithm.share_actor_critic) "
                    "is not run; allowed: cp=1",
                )
            ]
        )
    mt = getattr(worker.lm.config, "model_type", None)
    if mt not in ("llama", "qwen2", "qwen3"):
        raise ConfigError(
            [
                Problem(
                    "plan.cp",
                    f"context parallelism for model type {mt!r}; allowed: llama, qwen2, qwen3",
                )
            ]
        )
    _register()
    whole = worker.lm.forward
    worker.lm.forward = _ContextParallelForward(worker.lm, cp_group, rank, size, whole)
    if fsdp is not None:
        worker.shards = context_fsdp(worker, *fsdp, source=source, device=device)
    else:
        worker.shards = ContextShards(worker.module, cp_group, dp_group)
