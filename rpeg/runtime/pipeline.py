"""Pipeline parallelism (pp) of a causal LM for training and for the no-grad log-prob pass.

A unit at ``pp > 1`` cuts the model's decoder layers into ``pp * v`` contiguous chunks
(``v`` = 1, or :data:`INTERLEAVED_CHUNKS` for ``interleaved_1f1b``); chunk ``k`` lives on pipeline
rank ``k % pp`` (Megatron's interleaving: rank ``r`` holds chunks ``r, r + pp, ...``). The split
follows transformers' ``base_model_pp_plan`` (``embed_tokens -> layers -> norm``) and the causal
LM's ``_pp_plan`` (``lm_head``): the embedding runs at the head of chunk 0 (pipeline rank 0), the
final norm and the LM head at the end of the last chunk (pipeline rank ``pp - 1``). A tied
embedding/LM head is held twice (first and last rank) and its two gradients are summed before
the update, so both copies stay equal (Megatron's embedding group).

Only hidden states ``[b, T, H]`` cross stages: every pipeline rank of a data-parallel index holds
the same rows (like tp ranks), so each stage builds its own causal mask and rotary embedding
from the micro-batch's attention mask and positions, and knows the shape it receives (no shape
exchange; micro-batches may differ in rows and length, as the token budget makes them).

Schedules (:data:`PP_SCHEDULES`, the plan's ``pp_schedule``): ``gpipe`` (all forwards, then all
backwards), ``1f1b`` (PipeDream-flush, Narayanan et al. 2021, arXiv:2104.04473: ``pp - r - 1``
warm-up forwards, then one forward one backward) and ``interleaved_1f1b`` (the same with ``v``
chunks per rank, Megatron-LM's virtual pipeline; bubble ``(pp - 1) / v`` chunk-times instead of
``pp - 1``). :func:`schedule_orders` writes each rank's list of actions; :func:`check_orders`
replays them (sends never block, a receive waits for its send) and names a deadlock before
anything runs. Point-to-point messages are gloo/NCCL ``isend``/``irecv`` with one tag per
(kind, chunk, micro-batch), so their order on a link does not matter.

The training step is the runtime's (:func:`rpeg.runtime.updates.minibatch_updates`): the same
mini-batches, micro-batches and loss weights; the role's ``micro_loss`` runs on the last stage
(the LM's ``forward`` there runs the last chunk on the received hidden states,
:class:`_LastStageForward`), so every recipe's loss, the rollout correction and the metrics are
the runtime's own. Gradients: tied copies summed, averaged over dp replicas, clipped by the
norm over all stages (one all-reduce over pp). The metrics, computed on the last stage, are
broadcast to the pipeline group.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# the schedules :class:`Pipeline` runs (the plan's / unit's ``pp_schedule``), named once
from rpeg.compile.step import DEFAULT_DEVICE_TYPE
from rpeg.errors import ConfigError, Problem
from rpeg.plan.schema import DEFAULT_PP_SCHEDULE, PP_SCHEDULE_CHUNKS, PP_SCHEDULES

#: model chunks per pipeline rank under ``interleaved_1f1b`` (Megatron's virtual stages)
INTERLEAVED_CHUNKS = PP_SCHEDULE_CHUNKS["interleaved_1f1b"]


def chunks_per_rank(schedule: str) -> int:
    """``v``: model chunks per pipeline rank of ``schedule`` (a ConfigError names the allowed)."""
    if schedule not in PP_SCHEDULES:
        raise ConfigError(
            [
                Problem(
                    "pp_schedule",
                    f"unknown pipeline schedule {schedule!r}; allowed: {', '.join(PP_SCHEDULES)}",
                )
            ]
        )
    return PP_SCHEDULE_CHUNKS[schedule]


def pipeline_problems(
    num_layers: int, pp: int, schedule: str, where: str = "plan"
) -> list[Problem]:
    """Why ``pp`` (with ``schedule``) cannot split a model of ``num_layers`` decoder layers."""
    if pp <= 1:
        return []
    if schedule not in PP_SCHEDULES:
        return [
            Problem(
                f"{where}.pp_schedule",
                f"unknown pipeline schedule {schedule!r}; allowed: {', '.join(PP_SCHEDULES)}",
            )
        ]
    v = chunks_per_rank(schedule)
    if num_layers < pp * v:
        return [
            Problem(
                f"{where}.pp",
                f"pp={pp} x {v} chunk(s) per rank ({schedule}) needs at least {pp * v} decoder "
                f"layers; the model has {num_layers}",
            )
        ]
    return []


def split_layers(num_layers: int, chunks: int) -> list[range]:
    """Contiguous layer ranges of ``chunks`` model chunks, sizes differing by at most one; the
    first chunks take the remainder, so the last chunk (which also runs the norm, the LM head
    and the loss) gets the smaller share."""
    if chunks < 1 or num_layers < chunks:
        raise ValueError(f"cannot cut {num_layers} layers into {chunks} chunks")
    base, extra = divmod(num_layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


# --- schedules ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    """One step of a rank's schedule: ``kind`` "F" or "B" of global chunk ``chunk`` on
    micro-batch ``micro``."""

    kind: str
    chunk: int
    micro: int


def _one_f_one_b(pp: int, m: int, r: int) -> list[Action]:
    warm = min(pp - r - 1, m)
    out = [Action("F", r, j) for j in range(warm)]
    for j in range(m - warm):
        out += [Action("F", r, warm + j), Action("B", r, j)]
    out += [Action("B", r, j) for j in range(m - warm, m)]
    return out


def _interleaved(pp: int, v: int, m: int, r: int) -> list[Action]:
    """Megatron-LM's interleaved 1F1B order (``forward_backward_pipelining_with_interleaving``):
    micro-batches in groups of ``pp``, each group through chunk 0, 1, ... of this rank; backward
    in the same order through the chunks reversed. The last group may hold fewer micro-batches
    (``m`` need not be a multiple of ``pp``)."""
    seq: list[tuple[int, int]] = []  # (local chunk, micro) in forward order
    for g0 in range(0, m, pp):
        g = min(pp, m - g0)
        for c in range(v):
            seq += [(c, g0 + i) for i in range(g)]
    total = len(seq)
    fwd = [Action("F", c * pp + r, j) for c, j in seq]
    bwd = [Action("B", (v - 1 - c) * pp + r, j) for c, j in seq]
    warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
    out = fwd[:warm]
    for k in range(total - warm):
        out += [fwd[warm + k], bwd[k]]
    out += bwd[total - warm :]
    return out


def schedule_orders(schedule: str, pp: int, m: int) -> list[list[Action]]:
    """Each pipeline rank's actions for ``m`` micro-batches under ``schedule``."""
    v = chunks_per_rank(schedule)
    if schedule == "gpipe":
        return [
            [Action("F", r, j) for j in range(m)] + [Action("B", r, j) for j in range(m)]
            for r in range(pp)
        ]
    if schedule == "1f1b":
        return [_one_f_one_b(pp, m, r) for r in range(pp)]
    return [_interleaved(pp, v, m, r) for r in range(pp)]


def check_orders(orders: Sequence[Sequence[Action]], chunks: int, m: int) -> int:
    """Replay per-rank ``orders`` of a pipeline of ``chunks`` chunks (chunk ``k`` on rank
    ``k % len(orders)``) with non-blocking sends and blocking receives, one action per rank
    per round (a round = one chunk's forward or backward); returns the number of rounds (the
    step's length in those slots), or raises ValueError naming where it deadlocks or what is missing/repeated.
    F(k, j) needs F(k-1, j) done; B(k, j) needs F(k, j) on this rank and B(k+1, j) done."""
    pp = len(orders)
    want = {(kind, k, j) for kind in "FB" for k in range(chunks) for j in range(m)}
    have = [(a.kind, a.chunk, a.micro) for o in orders for a in o]
    if sorted(have) != sorted(want):
        raise ValueError("schedule does not run every chunk forward and backward once")
    for r, o in enumerate(orders):
        if any(a.chunk % pp != r for a in o):
            raise ValueError(f"rank {r} runs a chunk it does not hold")
    done: set[tuple[str, int, int]] = set()
    pos = [0] * pp
    rounds = 0
    while any(pos[r] < len(orders[r]) for r in range(pp)):
        moved = False
        before = set(done)  # a round's actions see only what earlier rounds finished
        for r in range(pp):
            if pos[r] >= len(orders[r]):
                continue
            a = orders[r][pos[r]]
            if a.kind == "F":
                ready = a.chunk == 0 or ("F", a.chunk - 1, a.micro) in before
            else:
                ready = ("F", a.chunk, a.micro) in before and (
                    a.chunk == chunks - 1 or ("B", a.chunk + 1, a.micro) in before
                )
            if ready:
                done.add((a.kind, a.chunk, a.micro))
                pos[r] += 1
                moved = True
        rounds += 1
        if not moved:
            stuck = {r: orders[r][pos[r]] for r in range(pp) if pos[r] < len(orders[r])}
            raise ValueError(f"pipeline schedule deadlocks at {stuck}")
    return rounds


def bubble_fraction(schedule: str, pp: int, m: int) -> float:
    """The idle share of a step's time on a pipeline rank (forward = backward / 2 ignored:
    uniform slots): ``(pp - 1) / (m + pp - 1)`` for gpipe and 1F1B, with ``v`` chunks per
    rank ``(pp - 1) / (v m + pp - 1)`` (the bubble is ``(pp - 1)`` chunk-times of ``1/v`` a
    stage each). The formula :mod:`rpeg.perf` prices (``rpeg.perf.costs``)."""
    v = chunks_per_rank(schedule)
    if pp <= 1:
        return 0.0
    return (pp - 1) / (v * m + pp - 1)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (tensor-parallel shard), else ``t``."""
    return getattr(t, "_local_tensor", t)


def _is_shard(t: torch.Tensor) -> bool:
    return any(pl.is_shard() for pl in getattr(t, "placements", ()))


# --- the model split --------------------------------------------------------------------------
@dataclass(frozen=True)
class PipeLayout:
    """Where a rank sits: ``pp`` pipeline ranks of ``dp`` data-parallel indices (of ``tp``
    tensor-parallel ranks each). Global rank ``r`` of the group: tp index ``r % tp``, pipeline
    rank ``(r // tp) % pp``, dp index ``r // (tp * pp)``."""

    pp: int
    dp: int = 1
    tp: int = 1
    schedule: str = DEFAULT_PP_SCHEDULE

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def pp_index(self, rank: int) -> int:
        return (rank // self.tp) % self.pp

    def dp_index(self, rank: int) -> int:
        return rank // (self.tp * self.pp)

    def tp_index(self, rank: int) -> int:
        return rank % self.tp

    def pp_ranks(self, rank: int) -> list[int]:
        base = self.dp_index(rank) * self.tp * self.pp + self.tp_index(rank)
        return [base + i * self.tp for i in range(self.pp)]

    def dp_ranks(self, rank: int) -> list[int]:
        off = self.pp_index(rank) * self.tp + self.tp_index(rank)
        return [d * self.tp * self.pp + off for d in range(self.dp)]

    def tp_ranks(self, rank: int) -> list[int]:
        base = rank - self.tp_index(rank)
        return list(range(base, base + self.tp))


def new_groups(
    layout: PipeLayout, rank: int, device_type: str = DEFAULT_DEVICE_TYPE
) -> dict[str, Any]:
    """This rank's pipeline, data-parallel and tensor-parallel process groups (every rank
    calls ``new_group`` for every group, in the same order, as torch requires); a group of
    one rank is None. At ``tp > 1`` they come from a ``(dp, pp, tp)`` DeviceMesh, whose
    ``tp`` sub-mesh (``"tp_mesh"``) splits the stage's blocks."""
    mine: dict[str, Any] = {"pp": None, "dp": None, "tp": None, "tp_mesh": None}
    if layout.tp > 1:  # tensor parallelism needs a DeviceMesh: (dp, pp, tp), row-major = ranks
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            device_type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=("dp", "pp", "tp")
        )
        for name, size in (("dp", layout.dp), ("pp", layout.pp), ("tp", layout.tp)):
            mine[name] = mesh.get_group(name) if size > 1 else None
        mine["tp_mesh"] = mesh["tp"]
        return mine
    for name, size, ranks_of in (
        ("pp", layout.pp, layout.pp_ranks),
        ("dp", layout.dp, layout.dp_ranks),
        ("tp", layout.tp, layout.tp_ranks),
    ):
        if size <= 1:
            continue
        seen: list[list[int]] = []
        for r in range(layout.world_size):
            ranks = ranks_of(r)
            if ranks not in seen:
                seen.append(ranks)
        for ranks in seen:
            g = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = g
    return mine


def _decoder(lm) -> nn.Module:
    """The LM's decoder (``lm.model``: the module ``base_model_pp_plan`` describes)."""
    plan = getattr(lm.config, "base_model_pp_plan", None) or {}
    missing = [k for k in ("embed_tokens", "layers", "norm") if k not in plan]
    base = getattr(lm, "model", None)
    if missing or base is None or getattr(lm, "lm_head", None) is None:
        raise ConfigError(
            [
                Problem(
                    "plan.pp",
                    f"model type {getattr(lm.config, 'model_type', '?')!r} has no pipeline plan "
                    "(transformers' base_model_pp_plan with embed_tokens, layers, norm and an "
                    "lm_head)",
                )
            ]
        )
    return base


def _tied(lm) -> bool:
    return bool(getattr(lm.config, "tie_word_embeddings", False))


class _Chunk:
    """One model chunk on this rank: decoder layers ``layers`` (global indices), with the
    embedding when it is the first chunk and the norm (+ head) when it is the last."""

    def __init__(self, index: int, layers: range, first: bool, last: bool):
        self.index, self.layers, self.first, self.last = index, layers, first, last


def _stage_hidden(lm, chunk: _Chunk, x, attention_mask, position_ids):
    """Run ``chunk``'s decoder layers on hidden states ``x`` (the embedding of ``x`` = token
    ids on the first chunk), the final norm on the last; the mask and rotary embedding are
    built here from the micro-batch, as ``LlamaModel.forward`` builds them."""
    from transformers.masking_utils import create_causal_mask

    base = lm.model
    if chunk.first:
        x = base.embed_tokens(x)
    causal = create_causal_mask(
        config=lm.config,
        inputs_embeds=x,
        attention_mask=attention_mask,
        cache=None,
        position_ids=position_ids,
    )
    pe = base.rotary_emb(x, position_ids=position_ids)
    for i in chunk.layers:
        x = base.layers[i](
            x,
            attention_mask=causal,
            position_embeddings=pe,
            position_ids=position_ids,
            cache=None,
            use_cache=False,
        )
    if chunk.last:
        x = base.norm(x)
    return x


class _LastStageForward:
    """The LM's ``forward`` on the last pipeline rank: runs the last chunk on the hidden
    states the schedule received for the current micro-batch (``pipeline.current_input``)
    and the LM head on the kept positions, returning ``.logits`` as the LM does (the
    runtime's :func:`rpeg.runtime.model_io.lm_logprobs` and its chunked log-prob head work
    unchanged). Called with token ids (no pipeline step running): refused."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def __call__(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        logits_to_keep: int = 0,
        use_cache: bool = False,
        **_: Any,
    ):
        p = self.pipeline
        x = p.current_input
        if x is None:
            raise RuntimeError(
                "a pipelined LM runs only inside its pipeline schedule "
                "(rpeg.runtime.pipeline.Pipeline)"
            )
        lm = p.lm
        h = _stage_hidden(lm, p.chunk(p.num_chunks - 1), x, attention_mask, position_ids)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return SimpleNamespace(logits=lm.lm_head(h))


@dataclass
class _Slot:
    """What a forward keeps for its backward: the input (to send its gradient back) and the
    output (or the weighted loss on the last chunk)."""

    inp: torch.Tensor | None
    out: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


class Pipeline:
    """This rank's stages of a causal LM over pipeline group ``group`` (``ranks``: the global
    ranks of the group in pipeline order) and how it runs a schedule.

    Built from a whole LM (or one on the meta device and filled later): the layers, embedding,
    norm and head of other ranks are dropped (:meth:`prune`), keeping the parameter names."""

    def minibatch_updates(
        self, role, batch, micro_loss, grad_norm_key: str = "grad_norm"
    ) -> dict[str, float]:
        """The role's training step through this pipeline (:func:`pipelined_updates`; what
        :func:`rpeg.runtime.updates.minibatch_updates` hands a pipelined role to)."""
        return pipelined_updates(role, batch, micro_loss, grad_norm_key)

    def __init__(self, lm, pp_index: int, ranks: Sequence[int], group, schedule: str):
        self.lm = lm
        self.pp = len(ranks)
        self.index = pp_index
        self.ranks = list(ranks)
        self.group = group
        self.schedule = schedule
        self.v = chunks_per_rank(schedule)
        self.num_chunks = self.pp * self.v
        base = _decoder(lm)
        n = lm.config.num_hidden_layers
        probs = pipeline_problems(n, self.pp, schedule)
        if probs:
            raise ConfigError(probs)
        self.layer_ranges = split_layers(n, self.num_chunks)
        self.tied = _tied(lm)
        self._chunks = {
            k: _Chunk(k, self.layer_ranges[k], k == 0, k == self.num_chunks - 1)
            for k in range(self.num_chunks)
        }
        self.mine = [k for k in range(self.num_chunks) if k % self.pp == pp_index]
        self.is_first = 0 in self.mine
        self.is_last = self.num_chunks - 1 in self.mine
        self.current_input: torch.Tensor | None = None
        self._pending: list[Any] = []
        #: set to a list to record each action of :meth:`run`: (kind, chunk, micro, start,
        #: end, seconds waiting on receives) in ``time.perf_counter`` seconds
        self.timeline: list[tuple[str, int, int, float, float, float]] | None = None
        #: every training run's actions since :meth:`take_actions`: (kind, chunk, micro,
        #: start, end, seconds waiting on receives), wall-clock seconds (a run's
        #: timeline.json: ``pipeline_actions``)
        self.actions: list[tuple[str, int, int, float, float, float]] = []
        self._wait = 0.0
        self._base = base
        lm.__dict__["_rpeg_pipeline"] = self  # checkpoint names (checkpoint_names)
        self.prune()
        if self.is_last:
            lm.forward = _LastStageForward(self)

    def take_actions(self) -> list[tuple[str, int, int, float, float, float]]:
        """The training runs' actions recorded since the last call (and forget them)."""
        out, self.actions = self.actions, []
        return out

    def chunk(self, k: int) -> _Chunk:
        return self._chunks[k]

    def owned_layers(self) -> list[int]:
        return [i for k in self.mine for i in self.layer_ranges[k]]

    def prune(self) -> None:
        """Drop what other pipeline ranks hold: their decoder layers (an empty
        ``nn.Identity`` keeps the list's indices, so the names of this rank's parameters are
        the whole model's), the embedding off the first rank, norm and head off the last."""
        base = self._base
        keep = set(self.owned_layers())
        for i in range(len(base.layers)):
            if i not in keep:
                base.layers[i] = nn.Identity()
        if not self.is_last:
            base.norm = None
            self.lm.lm_head = None
        if not self.is_first:
            if self.is_last and self.tied:
                # the head keeps its own copy of the tied weight (summed gradients: sync_tied)
                self.lm.lm_head.weight = nn.Parameter(base.embed_tokens.weight.detach().clone())
            base.embed_tokens = None

    # --- point to point ----------------------------------------------------------------------
    def _rank_of_chunk(self, k: int) -> int:
        return self.ranks[k % self.pp]

    def _tag(self, kind: str, k: int, j: int) -> int:
        return (j * self.num_chunks + k) * 2 + (0 if kind == "F" else 1)

    def _send(self, t: torch.Tensor, to_chunk: int, kind: str, k: int, j: int) -> None:
        t = t.detach().contiguous()
        self._pending.append(
            (dist.isend(t, dst=self._rank_of_chunk(to_chunk), tag=self._tag(kind, k, j)), t)
        )

    def _recv(self, shape, dtype, from_chunk: int, kind: str, k: int, j: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        t0 = time.perf_counter()
        dist.recv(buf, src=self._rank_of_chunk(from_chunk), tag=self._tag(kind, k, j))
        self._wait += time.perf_counter() - t0
        return buf

    def _drain(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()

    @property
    def device(self) -> torch.device:
        return next(iter(self.lm.parameters())).device

    @property
    def hidden_dtype(self) -> torch.dtype:
        return next(iter(self.lm.parameters())).dtype

    # --- running a schedule ------------------------------------------------------------------
    def run(
        self,
        micros: Sequence[Any],
        last_fn: Callable[[int, Any], tuple[torch.Tensor, dict[str, float]]],
        *,
        train: bool,
        autocast: Callable[[], Any] = contextlib.nullcontext,
    ) -> list[dict[str, float]]:
        """Run micro-batches ``micros`` (each with ``input_ids``, ``attention_mask``,
        ``position_ids``) through the pipeline. On the last chunk ``last_fn(j, micro)`` runs
        the LM (its forward takes the received hidden states) and returns (the scalar to
        backpropagate, already weighted; stats); ``train``: the schedule's backward passes
        too (gradients accumulate into the stage's parameters), else forwards only in order.
        Returns the stats of each micro-batch on the last pipeline rank ({} elsewhere)."""
        m = len(micros)
        hidden = self.lm.config.hidden_size
        orders = (
            schedule_orders(self.schedule, self.pp, m)
            if train
            else [
                [
                    Action("F", k, j)
                    for j in range(m)
                    for k in range(self.num_chunks)
                    if k % self.pp == r
                ]
                for r in range(self.pp)
            ]
        )
        if not train:  # forward only: micro-batch by micro-batch through the chunks
            orders = [sorted(o, key=lambda a: (a.micro, a.chunk)) for o in orders]
        slots: dict[tuple[int, int], _Slot] = {}
        stats: list[dict[str, float]] = [{} for _ in range(m)]
        grad_ctx = contextlib.nullcontext() if train else torch.no_grad()
        wall = time.time() - time.perf_counter()  # perf_counter -> epoch seconds
        try:
            with grad_ctx:
                for a in orders[self.index]:
                    mb = micros[a.micro]
                    ch = self._chunks[a.chunk]
                    t0, self._wait = time.perf_counter(), 0.0
                    if a.kind == "F":
                        self._forward(a, ch, mb, hidden, slots, stats, last_fn, train, autocast)
                    else:
                        self._backward(a, ch, mb, hidden, slots)
                    t1 = time.perf_counter()
                    if train:
                        span = (t0 + wall, t1 + wall, self._wait)
                        self.actions.append((a.kind, a.chunk, a.micro, *span))
                    if self.timeline is not None:
                        self.timeline.append((a.kind, a.chunk, a.micro, t0, t1, self._wait))
        finally:
            self.current_input = None
            self._drain()
        return stats

    def _forward(self, a, ch, mb, hidden, slots, stats, last_fn, train, autocast) -> None:
        b, t = mb.input_ids.shape
        dev = self.device
        if ch.first:
            x = mb.input_ids.to(dev)
        else:
            x = self._recv((b, t, hidden), self.hidden_dtype, a.chunk - 1, "F", a.chunk, a.micro)
            if train:
                x.requires_grad_(True)
        mask, pos = mb.attention_mask.to(dev), mb.position_ids.to(dev)
        if ch.last:
            self.current_input = x
            try:
                out, st = last_fn(a.micro, mb)
            finally:
                self.current_input = None
            stats[a.micro] = st
        else:
            with autocast():
                out = _stage_hidden(self.lm, ch, x, mask, pos)
            self._send(out.to(self.hidden_dtype), a.chunk + 1, "F", a.chunk + 1, a.micro)
        if train:
            slots[(a.chunk, a.micro)] = _Slot(None if ch.first else x, out)

    def _backward(self, a, ch, mb, hidden, slots) -> None:
        s = slots.pop((a.chunk, a.micro))
        if ch.last:
            s.out.backward()
        else:
            b, t = mb.input_ids.shape
            g = self._recv((b, t, hidden), self.hidden_dtype, a.chunk + 1, "B", a.chunk, a.micro)
            torch.autograd.backward(s.out, g.to(s.out.dtype))
        if not ch.first:
            gx = s.inp.grad if s.inp.grad is not None else torch.zeros_like(s.inp)
            self._send(gx, a.chunk - 1, "B", a.chunk - 1, a.micro)

    # --- gradients ---------------------------------------------------------------------------
    def tied_params(self) -> list[nn.Parameter]:
        """This rank's copy of the tied embedding/LM-head weight (first or last rank), or []."""
        if not self.tied or self.pp == 1:
            return []
        if self.is_first:
            return [self._base.embed_tokens.weight]
        if self.is_last:
            return [self.lm.lm_head.weight]
        return []

    def sync_tied(self) -> None:
        """Sum the tied weight's gradient over its two copies (first and last rank)."""
        tied = self.tied_params()
        if not tied:
            return
        p = tied[0]
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        other = self.ranks[-1] if self.is_first else self.ranks[0]
        theirs = torch.empty_like(g)
        work = dist.isend(g.contiguous(), dst=other, tag=1 << 30)
        dist.recv(theirs, src=other, tag=1 << 30)
        work.wait()
        p.grad = g + theirs

    def grad_norm_and_clip(self, params, max_norm: float, dp_group=None, tp_group=None) -> float:
        """Average the gradients over ``dp_group`` (replicas), sum the tied copies, then the
        L2 norm over every stage (the tied weight counted once; tensor-parallel shards summed
        over ``tp_group``, replicated parameters counted once) and clip in place; the norm is
        the one the whole model's gradient has, the same on every rank."""
        from rpeg.runtime.tensor_parallel import sum_partial_grads

        params = [p for p in params if p.grad is not None]
        if tp_group is not None:
            sum_partial_grads(self.lm)  # per-head norms kept whole: their partial gradients
        if dp_group is not None:
            n = dist.get_world_size(dp_group)
            for p in params:
                g = _local(p.grad)
                dist.all_reduce(g, group=dp_group)
                g.div_(n)
        self.sync_tied()
        params = [p for p in params if p.grad is not None]
        skip = {id(p) for p in self.tied_params()} if self.is_last and not self.is_first else set()
        sharded = torch.zeros((), dtype=torch.float64)
        whole = torch.zeros((), dtype=torch.float64)
        for p in params:
            if id(p) in skip:
                continue
            sq = _local(p.grad).detach().double().pow(2).sum().cpu()
            if _is_shard(p.grad):
                sharded += sq
            else:
                whole += sq
        if tp_group is not None:
            dist.all_reduce(sharded, group=tp_group)
        sq = sharded + whole
        if self.group is not None:
            dist.all_reduce(sq, group=self.group)
        norm = float(sq.sqrt())
        if math.isfinite(norm):
            coef = max_norm / (norm + 1e-6)
            if coef < 1.0:
                for p in params:
                    _local(p.grad).mul_(coef)
        return norm

    def broadcast_from_last(self, obj: Any) -> Any:
        """``obj`` of the last pipeline rank, on every rank of the group."""
        if self.group is None:
            return obj
        box = [obj if self.is_last else None]
        dist.broadcast_object_list(box, src=self.ranks[-1], group=self.group)
        return box[0]

    def broadcast_tensor_from_last(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (its shape and dtype known everywhere) of the last rank, on every rank."""
        if self.group is None:
            return t
        t = t.contiguous()
        dist.broadcast(t, src=self.ranks[-1], group=self.group)
        return t


# --- the role's passes ------------------------------------------------------------------------
def apply_pipeline(
    worker,
    layout: PipeLayout,
    rank: int,
    groups: dict[str, Any],
    *,
    source=None,
    device: torch.device | None = None,
) -> Pipeline:
    """Cut ``worker``'s (a :class:`rpeg.runtime.roles.PolicyWorker`) LM into this rank's
    stages, rebuild its optimizer over what it keeps, and attach the pipeline
    (``worker.pipeline``; ``worker.pp_dp_group``: the data-parallel group of replicas).
    An LM built on the meta device is given storage on ``device`` and filled from
    ``source`` (a :class:`rpeg.runtime.materialize.WeightSource`) with this rank's stage
    tensors only (:func:`materialize_stages`). Refuses what it does not run, by name: a shared value head (PPO actor-critic on one
    trunk)."""
    if getattr(worker, "loss_scaler", None) is not None:
        raise ConfigError(
            [
                Problem(
                    "workload.precision",
                    "pipeline parallelism with fp16 loss scaling is not run; allowed: "
                    "fp32, bf16 (or pp=1)",
                )
            ]
        )
    if getattr(worker, "shared_critic", False):
        raise ConfigError(
            [
                Problem(
                    "plan.pp",
                    "pipeline parallelism with a shared value head "
                    "(algorithm.share_actor_critic) is not run; allowed: pp=1",
                )
            ]
        )
    pipe = Pipeline(
        worker.lm, layout.pp_index(rank), layout.pp_ranks(rank), groups.get("pp"), layout.schedule
    )
    worker.pipeline = pipe
    worker.pp_dp_group = groups.get("dp")
    worker.pp_tp_group = groups.get("tp")
    if groups.get("tp_mesh") is not None:  # this stage's blocks split over tp
        from rpeg.runtime.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(worker.lm, groups["tp_mesh"])
    from rpeg.runtime.materialize import on_meta

    if on_meta(worker.lm):
        if source is None:
            raise ValueError("a pipelined LM on the meta device needs a weight source")
        materialize_stages(pipe, device or torch.device("cpu"), source.fetch)
    if worker.optimizer is not None:  # over the stage's parameters (new ones after to_empty)
        worker.optimizer = worker._make_optimizer()
    return pipe


def _autocast(worker) -> Callable[[], Any]:
    from rpeg.runtime.precision import compute

    dev = worker.device
    return lambda: compute(dev.type, worker.compute_dtype)


def pipelined_updates(
    role, batch, micro_loss, grad_norm_key: str = "grad_norm"
) -> dict[str, float]:
    """:func:`rpeg.runtime.updates.minibatch_updates` on a pipelined role: the same
    mini-batches (:func:`rpeg.runtime.updates.minibatch_rows`), micro-batches and loss
    weights; each mini-batch's micro-batches run through the pipeline schedule, the role's
    ``micro_loss`` on the last stage. Metrics are the last stage's, on every pipeline rank."""
    from rpeg.runtime.micro_batches import micro_batches
    from rpeg.runtime.updates import (
        apply_update,
        micro_weight,
        mini_total,
        minibatch_rows,
    )

    pipe: Pipeline = role.pipeline
    module, optimizer = role.module, role.optimizer
    algorithm, workload, reduce = role.algorithm, role.workload, role.reduce
    generator, grad_clip = role.generator, role.optim_cfg.grad_clip
    agg = algorithm.loss_aggregation
    autocast = _autocast(role)
    sums: dict[str, float] = {}
    steps = 0
    module.train()
    try:
        for _ in range(algorithm.ppo_epochs):
            for rows in minibatch_rows(
                batch, workload.train_minibatches, generator, reduce, workload.samples_per_prompt
            ):
                mini = batch.select(rows) if rows else None
                total, n_rows = mini_total(mini, agg, reduce)
                if not n_rows:
                    continue
                if (check := getattr(role, "before_update", None)) is not None:
                    check(steps, mini)
                optimizer.zero_grad(set_to_none=True)
                parts = micro_batches(mini or batch.select([0]), role)
                weights = [
                    micro_weight(mb, total, agg, reduce) if real and mini else 0.0
                    for _, mb, real in parts
                ]

                def last_fn(j, mb, weights=weights):
                    loss, m = micro_loss(mb)  # the role's forward: under its autocast
                    w = weights[j]
                    return loss * w, {k: w * v for k, v in m.items()}

                per_micro = pipe.run(
                    [mb for _, mb, _ in parts], last_fn, train=True, autocast=autocast
                )
                stats: dict[str, float] = {}
                for st in per_micro:
                    for k, v in st.items():
                        stats[k] = stats.get(k, 0.0) + v
                gn = pipe.grad_norm_and_clip(
                    list(module.parameters()),
                    grad_clip,
                    getattr(role, "pp_dp_group", None),
                    getattr(role, "pp_tp_group", None),
                )
                apply_update(optimizer, stats, gn, grad_norm_key)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
        optimizer.zero_grad(set_to_none=True)
    finally:
        module.eval()
    out = {k: v / max(steps, 1) for k, v in sums.items()}
    return pipe.broadcast_from_last(out)


@torch.no_grad()
def pipelined_logprobs(worker, batch, *, with_entropy: bool = False):
    """:meth:`PolicyWorker.compute_logprobs` through the pipeline: the same micro-batches,
    forwards only; the last stage's log-probs ``[B,R]`` (and entropies) on every rank."""
    from rpeg.runtime.micro_batches import micro_batches

    pipe: Pipeline = worker.pipeline
    worker.module.eval()
    r = batch.response_ids.shape[1]
    lp_out = torch.zeros((batch.size, r), dtype=torch.float32)
    ent_out = torch.zeros((batch.size, r), dtype=torch.float32)
    parts = micro_batches(batch, worker)

    def last_fn(j, mb):
        ix, _, real = parts[j]
        lp, ent, _ = worker._forward(mb, batch.temperature, with_entropy=with_entropy)
        if real:
            m = mb.response_mask
            lp_out[ix, : lp.shape[1]] = lp.float().cpu() * m
            if with_entropy:
                ent_out[ix, : ent.shape[1]] = ent.float().cpu() * m
        return lp, {}

    pipe.run([mb for _, mb, _ in parts], last_fn, train=False, autocast=_autocast(worker))
    lp_out = pipe.broadcast_tensor_from_last(lp_out)
    if with_entropy:
        return lp_out, pipe.broadcast_tensor_from_last(ent_out)
    return lp_out


# --- construction, weights, checkpoints -------------------------------------------------------
def _tied_name(pipe: Pipeline, name: str) -> str | None:
    """The other name of the tied embedding/LM-head weight (None: ``name`` is not it)."""
    if not pipe.tied:
        return None
    return {"lm_head.weight": "model.embed_tokens.weight"}.get(name) or (
        "lm_head.weight" if name == "model.embed_tokens.weight" else None
    )


def materialize_stages(pipe: Pipeline, device: torch.device, fetch) -> int:
    """Give a pipelined LM built on the meta device (and pruned to this rank's stages by
    :class:`Pipeline`) storage on ``device`` and fill it from ``fetch`` (a
    :class:`rpeg.runtime.materialize.WeightSource`'s): only this rank's stage tensors are
    allocated and read. The last rank's copy of a tied LM head reads the embedding where the
    source has no ``lm_head.weight`` (a saved tied model stores it once). Returns the bytes
    this rank holds; a name the source lacks is an error naming it."""
    from rpeg.runtime.model_io.loading import rebuild_rotary

    lm = pipe.lm
    lm.to_empty(device=device)
    rebuild_rotary(lm, device)
    held, missing = 0, []
    with torch.no_grad():
        for name, cur in lm.state_dict(keep_vars=True).items():
            full = fetch(name)
            if full is None and (alt := _tied_name(pipe, name)) is not None:
                full = fetch(alt)
            if full is None:
                missing.append(name)
                continue
            if tuple(full.shape) != tuple(cur.shape):
                raise ValueError(
                    f"pipeline stage {pipe.index}: {name} has shape {tuple(full.shape)} in the "
                    f"source, {tuple(cur.shape)} in the model"
                )
            local = _local(cur)
            full = full.to(device=local.device, dtype=cur.dtype)
            if local is not cur:  # a tensor-parallel shard: this rank's slice
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(full, cur.device_mesh, cur.placements, src_data_rank=None)
                full = full._local_tensor
            local.copy_(full)
            held += local.numel() * local.element_size()
    if missing:
        raise KeyError(
            f"pipeline stage {pipe.index}: the weights lack {missing[:5]} ({len(missing)} in all)"
        )
    return held


def stage_state_dict(pipe: Pipeline) -> dict[str, torch.Tensor]:
    """This rank's weights under the whole model's names (the last rank's copy of a tied LM
    head left out: the first rank's embedding is the one tensor)."""
    skip = {"lm_head.weight"} if pipe.tied and pipe.pp > 1 and not pipe.is_first else set()
    return {k: v for k, v in pipe.lm.state_dict().items() if k not in skip}


def full_state_dict(pipe: Pipeline) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank of the pipeline group (each stage's tensors
    gathered; a tied head under both names, as the unsplit LM's ``state_dict`` has them):
    what a generator or an unsplit checkpoint needs. One object all-gather over pp (CPU
    copies): for the tiny and test models; a bucketed transfer is the runtime's part."""
    mine = {  # a tensor-parallel shard gathered over tp first (every tp rank calls this)
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
        for k, v in stage_state_dict(pipe).items()
    }
    if pipe.group is None:
        parts = [mine]
    else:
        parts = [None] * pipe.pp
        dist.all_gather_object(parts, mine, group=pipe.group)
    out: dict[str, torch.Tensor] = {}
    for p in parts:
        out.update(p)
    if pipe.tied and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def checkpoint_names(
    module, msd: dict, osd: dict | None, *, saving: bool
) -> tuple[dict, dict | None]:
    """DCP state dicts of a pipelined LM under the unsplit model's names (``saving``), or
    back (not ``saving``): the last rank's copy of a tied LM head is the embedding's tensor
    in an unsplit checkpoint, whose optimizer state is stored under
    ``model.embed_tokens.weight`` alone. Saving adds that name beside ``lm_head.weight``
    (DCP writes a key once: the copies are equal) and moves the head's optimizer state to
    it; loading undoes it before ``set_state_dict``. Any other module: unchanged."""
    pipe = getattr(module, "__dict__", {}).get("_rpeg_pipeline")
    head, emb = "lm_head.weight", "model.embed_tokens.weight"
    if pipe is None or not pipe.tied or pipe.pp == 1 or pipe.is_first or not pipe.is_last:
        return msd, osd
    src, dst = (head, emb) if saving else (emb, head)
    msd = dict(msd)
    if saving:
        msd[emb] = msd[head]
    else:
        msd.pop(emb, None)
    if osd is not None:
        osd = dict(osd)
        st = dict(osd.get("state", {}))
        if src in st:
            st[dst] = st.pop(src)
        osd["state"] = st
        osd["param_groups"] = [
            {**g, "params": [dst if n == src else n for n in g["params"]]}
            for g in osd.get("param_groups", [])
        ]
    return msd, osd


def pipeline_weight_source(pipe: Pipeline, dtype: torch.dtype | None = None):
    """``(meta, fetch)`` of the whole model's weights for a weight sync from a pipelined
    trainer (:func:`rpeg.runtime.actors.weight_sync.stream_buckets`): ``meta`` has every
    name of the unsplit LM (full shapes; floating tensors in ``dtype``), ``fetch(name)``
    broadcasts that tensor from the pipeline rank holding it (a tensor-parallel shard
    gathered over tp first) to every rank of the pipeline group -- one tensor alive at a
    time, so buckets fill without any rank holding the whole model twice. Every rank of the
    group fetches the same names in the same order (a collective)."""
    cached = getattr(pipe, "_sync_meta", None)
    state = stage_state_dict(pipe)

    def target(v: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and v.is_floating_point() else v.dtype

    if cached is None:
        mine = {k: (tuple(v.shape), v.dtype, pipe.index) for k, v in state.items()}
        if pipe.group is None:
            parts = [mine]
        else:
            parts = [None] * pipe.pp
            dist.all_gather_object(parts, mine, group=pipe.group)
        owners: dict[str, tuple[tuple[int, ...], torch.dtype, int]] = {}
        for p in parts:
            owners.update(p)
        if pipe.tied and "model.embed_tokens.weight" in owners:
            owners["lm_head.weight"] = owners["model.embed_tokens.weight"]
        cached = pipe._sync_meta = owners  # type: ignore[attr-defined]
    owners = cached
    meta = {
        k: (shape, dtype if dtype is not None and dt.is_floating_point else dt)
        for k, (shape, dt, _) in owners.items()
    }
    dev = pipe.device

    def fetch(name: str) -> torch.Tensor:
        shape, dt, owner = owners[name]
        if name == "lm_head.weight" and pipe.tied:
            name = "model.embed_tokens.weight"
        out_dt = meta[name][1]
        if owner == pipe.index:
            v = state[name].detach()
            v = v.full_tensor() if hasattr(v, "full_tensor") else v
            buf = v.to(device=dev, dtype=out_dt).contiguous()
        else:
            buf = torch.empty(shape, dtype=out_dt, device=dev)
        if pipe.group is not None:
            dist.broadcast(buf, src=pipe.ranks[owner], group=pipe.group)
        return buf

    return meta, fetch


def load_unsplit_state(worker, msd: dict, osd: dict | None) -> None:
    """Load a whole (unsplit) model's weights ``msd`` and optimizer state ``osd`` (an
    unsharded role's checkpoint: ``rpeg.runtime.role_state.role_state``, e.g. rank 0 of
    data-parallel replicas) into this rank's stages: each stage takes its own tensors, and
    the optimizer state of each of its parameters by the parameter's position in the whole
    model (the tied LM head's copy takes the embedding's). A checkpoint whose entries do not
    map onto the whole model's parameters one to one is refused, naming the counts."""
    pipe: Pipeline = worker.pipeline
    own = worker.module.state_dict()
    sd = {}
    for k in own:
        src = k if k in msd else _tied_name(pipe, k)
        if src is None or src not in msd:
            raise KeyError(f"pipeline stage {pipe.index}: the checkpoint lacks {k}")
        sd[k] = msd[src]
    worker.module.load_state_dict(sd)
    eng_model = getattr(worker.engine, "model", None)
    if isinstance(eng_model, nn.Module) and eng_model is not worker.lm:
        # the generation copy (whole, or split at gen_tp) takes the same whole weights
        from rpeg.runtime.sharding import load_tensors

        load_tensors(eng_model, list(eng_model.state_dict()), msd.__getitem__)
    if osd is None or worker.optimizer is None:
        return
    names = [k for k in msd if not (pipe.tied and k == "lm_head.weight")]
    count = sum(len(g["params"]) for g in osd["param_groups"])
    if len(osd["param_groups"]) != 1 or len(names) != count:
        raise ValueError(
            f"pipeline stage {pipe.index}: the checkpoint's optimizer holds {count} parameters "
            f"in {len(osd['param_groups'])} group(s), its model {len(names)} tensors; only one "
            "group over every tensor maps onto the stages"
        )
    index = {n: i for i, n in enumerate(names)}
    mine = [n for n, p in worker.lm.named_parameters() if p.requires_grad]
    state = {}
    for j, n in enumerate(mine):
        i = index[n if n in index else _tied_name(pipe, n) or n]
        if i in osd["state"]:
            state[j] = osd["state"][i]
    group = {**osd["param_groups"][0], "params": list(range(len(mine)))}
    worker.optimizer.load_state_dict({"state": state, "param_groups": [group]})
