"""One RL update of a trainable role: mini-batches, micro-batch loss weights, gradient
sync and clipping, the optimizer step -- what ``PolicyWorker.train_step`` and
``CriticWorker.train_step`` share (:func:`minibatch_updates`), and the optimizer they build
(:func:`adamw`).

Every micro-batch loss is weighted so that accumulating micro-batches, and averaging the
gradients over data-parallel ranks, equals one loss over the global mini-batch
(:func:`micro_weight`; docs/parallelism.md "Data parallelism").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from rpeg.runtime.batch import SAMPLE_FIELDS, TOKEN_FIELDS, RolloutBatch, chunk_order
from rpeg.runtime.micro_batches import micro_batches
from rpeg.runtime.parallel import RankReduce
from rpeg.runtime.tensor_parallel import local_tensor

#: metric: the share of a step's optimizer updates skipped for a non-finite gradient norm
SKIPPED_UPDATES = "skipped_update_frac"


def _loss_count(b: RolloutBatch, aggregation: str) -> float:
    """What a mini-batch loss averages over: response tokens (token_mean) or sequences."""
    return float(b.response_mask.sum()) if aggregation == "token_mean" else float(b.size)


def mini_total(
    mini: RolloutBatch | None, aggregation: str, reduce: RankReduce
) -> tuple[float, int]:
    """The mini-batch's loss count and rows over every data-parallel rank (one all-reduce,
    once per mini-batch, in the same order on every rank); ``mini`` None: this rank holds
    none of its rows."""
    mine = (0.0, 0) if mini is None else (_loss_count(mini, aggregation), mini.size)
    t = reduce.sum(torch.tensor(mine, dtype=torch.float64))
    return max(float(t[0]), 1.0), int(t[1])


def minibatch_rows(
    batch: RolloutBatch,
    n: int,
    generator: torch.Generator | None,
    reduce: RankReduce,
    group_size: int,
) -> list[list[int]]:
    """Row indices of ``batch`` in each of ``n`` mini-batches, the same partition of the
    step's rollout on every layout: a random permutation (``generator``; None: in order) of
    the rollout's row positions ``0 .. R-1`` (``batch.sample_index``; ``R`` agreed over the
    data-parallel group), stratified by prompt when ``group_size`` (samples per prompt) > 1
    (:func:`rpeg.runtime.batch.chunk_order`: every chunk an equal share of every prompt's
    samples, so every rank the same number of rows per chunk), cut into ``n`` near-equal
    chunks; each rank takes the rows of a chunk it holds. The single process (``R`` = its
    batch) gets all of each chunk; a data-parallel rank a share, possibly none. Every rank
    gets the same number of lists. A batch without ``sample_index``, or holding a position
    twice (rows of several steps), is split on its own rows."""
    idx = batch.sample_index
    if idx is None or idx.unique().numel() != idx.numel():
        return [m.tolist() for m in chunk_order(batch.size, n, generator, group_size)]
    here = torch.tensor([int(idx.max()) + 1 if idx.numel() else 0], dtype=torch.long)
    r = int(reduce.max(here)[0])
    where = torch.full((r,), -1, dtype=torch.long)
    where[idx] = torch.arange(batch.size)
    return [where[c][where[c] >= 0].tolist() for c in chunk_order(r, n, generator, group_size)]


def micro_weight(micro: RolloutBatch, total: float, aggregation: str, reduce: RankReduce) -> float:
    """Weight of a micro-batch's loss so that accumulating micro-batches (and DDP's average of
    gradients over ``world_size`` ranks) equals one loss over the whole global mini-batch."""
    return reduce.world_size * _loss_count(micro, aggregation) / total


def _grad_norm_and_clip(params, max_norm: float, shards=None, loss_scale: float = 1.0) -> float:
    """The gradient norm before clipping, gradients averaged over dp and clipped in place;
    with ``loss_scale`` != 1 (fp16: :class:`rpeg.runtime.precision.LossScaler`) the
    gradients are first divided by it (an overflow stays inf: the update is skipped)."""
    params = [p for p in params if p.grad is not None]
    if loss_scale != 1.0:
        from rpeg.runtime.precision import unscale_

        unscale_(params, 1.0 / loss_scale)
    if shards is not None:
        # replicas' gradients averaged over dp, then a norm over DTensors (collectives)
        shards.sync_grads()
        return shards.clip_grads(params, max_norm)
    if not params:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def on_device(b: RolloutBatch, device: torch.device) -> RolloutBatch:
    """``b`` with its tensor fields on ``device`` (a no-op on the CPU)."""
    if device.type == "cpu":
        return b
    kw = {}
    for name in (*TOKEN_FIELDS, *SAMPLE_FIELDS, "prompt_ids", "prompt_mask"):
        v = getattr(b, name)
        if isinstance(v, torch.Tensor):
            kw[name] = v.to(device, non_blocking=True)
    return b.replace(**kw)


def minibatch_updates(
    role: Any,  # a trainable rpeg.runtime.roles worker (the attributes below)
    batch: RolloutBatch,
    micro_loss: Callable[[RolloutBatch], tuple[torch.Tensor, dict[str, float]]],
    *,
    grad_norm_key: str = "grad_norm",
) -> dict[str, float]:
    """The updates of one trainable ``role`` (its module, optimizer, algorithm, workload,
    gradient clip, shuffling generator, rank reduce and shards) on ``batch``:
    ``algorithm.ppo_epochs`` passes over ``batch`` in ``workload.train_minibatches``
    shuffled mini-batches (:func:`minibatch_rows`: the same on every layout), one optimizer
    step each, accumulating micro-batches (:func:`rpeg.runtime.micro_batches.micro_batches`:
    the compiled unit's ``micro_batch_size`` samples or its token budget, read from
    ``role.micro_batching``). ``micro_loss(micro) -> (loss, metrics)``; each
    micro-batch loss is weighted so that accumulation (and the average of gradients over
    data-parallel ranks) equals one loss over the global mini-batch. ``shards``
    (:class:`rpeg.runtime.sharding.Shards`): average replicated gradients over dp and clip
    over DTensors, and the pass's FSDP gathering (:meth:`Shards.training_pass`). Returns the
    metrics averaged over optimizer steps, with the gradient norm (before clipping) under
    ``grad_norm_key``; an update whose gradient norm is not finite is skipped (its gradients
    dropped, the weights and optimizer state untouched) and counted in
    :data:`SKIPPED_UPDATES`."""
    pipe = getattr(role, "pipeline", None)
    if pipe is not None:  # pp > 1: the role's rpeg.runtime.pipeline.Pipeline runs the step
        return pipe.minibatch_updates(role, batch, micro_loss, grad_norm_key)
    module, shards = role.module, role.shards
    module.train()
    with shards.training_pass(module) if shards is not None else contextlib.nullcontext():
        sums, steps = _updates(role, batch, micro_loss, grad_norm_key)
    module.eval()
    return {k: v / max(steps, 1) for k, v in sums.items()}


def _updates(role, batch, micro_loss, grad_norm_key) -> tuple[dict[str, float], int]:
    """:func:`minibatch_updates`' loop: the metric sums and the optimizer steps taken."""
    module, optimizer = role.module, role.optimizer
    algorithm, workload, reduce = role.algorithm, role.workload, role.reduce
    generator, grad_clip, shards = role.generator, role.optim_cfg.grad_clip, role.shards
    scaler = getattr(role, "loss_scaler", None)  # fp16 compute only (rpeg.runtime.precision)
    sums: dict[str, float] = {}
    steps = 0
    agg = algorithm.loss_aggregation
    for _ in range(algorithm.ppo_epochs):
        for rows in minibatch_rows(
            batch, workload.train_minibatches, generator, reduce, workload.samples_per_prompt
        ):
            mini = batch.select(rows) if rows else None
            total, n_rows = mini_total(mini, agg, reduce)
            if not n_rows:  # no rank holds a row of this chunk (filtered groups)
                continue
            if (check := getattr(role, "before_update", None)) is not None:
                check(steps, mini)  # the policy's lag check (PolicyWorker.before_update)
            optimizer.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            scale = 1.0 if scaler is None else scaler.scale
            # a rank without rows of the chunk runs one of its rows at weight 0 (collectives)
            for _, micro, real in micro_batches(mini or batch.select([0]), role):
                w = micro_weight(micro, total, agg, reduce) if real and mini else 0.0
                loss, m = micro_loss(micro)
                (loss * (w * scale)).backward()
                for k, v in m.items():
                    stats[k] = stats.get(k, 0.0) + w * v
            gn = _grad_norm_and_clip(module.parameters(), grad_clip, shards, scale)
            if scaler is not None:
                scaler.update(math.isfinite(gn))
                stats["loss_scale"] = scale
            apply_update(optimizer, stats, gn, grad_norm_key, shards)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    # the last update's gradients are not needed again: freed now, not held through the
    # next rollout beside the optimizer state (a trained role's shard of fp32 gradients)
    optimizer.zero_grad(set_to_none=True)
    return sums, steps


def apply_update(
    optimizer, stats: dict[str, float], grad_norm: float, grad_norm_key: str, shards=None
) -> None:
    """One optimizer update after the gradients were reduced and clipped (``grad_norm``: the
    norm before clipping, recorded under ``grad_norm_key``). An inf/nan gradient (an overflow,
    a bad sample) would make every weight nan for good: that update is skipped, as verl's
    actors do, and counted under :data:`SKIPPED_UPDATES`; the norm is reduced over the group,
    so every rank skips the same one (and an fp16 scaler halves the same loss scale).
    ``shards`` whose gradient sum split the update (``split_update``: a replica pair,
    rpeg.runtime.pair_update) update their half and swap weight halves."""
    skip = not math.isfinite(grad_norm)
    stats[grad_norm_key] = grad_norm
    stats[SKIPPED_UPDATES] = float(skip)
    if skip:
        optimizer.zero_grad(set_to_none=True)
    elif (split := getattr(shards, "split_update", None)) is not None:
        split.step(optimizer)  # a pair's halves (rpeg.runtime.pair_update)
    else:
        optimizer.step()


def adamw(params, **options) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with the fused update where every parameter allows it (floating
    point, on the CPU or a CUDA device: one kernel reading and writing each parameter, its
    gradient and its two moments once -- the 16 B per parameter at memory speed the
    performance model prices, rpeg.perf.passes.optimizer_s), the multi-tensor (``foreach``)
    update otherwise. Measured on rpeg-tiny's 4.0M parameters, one thread: 2.9 ms per step
    fused, 16.7 ms foreach (several passes over the state), 13.7 ms torch's CPU default (one
    update per tensor in a Python loop) -- docs/measurements.md. Runs on the local shards of
    DTensor parameters (:class:`_AdamW`)."""
    params = list(params)
    flat = (
        [p for g in params for p in g["params"]]
        if params and isinstance(params[0], dict)
        else params
    )
    fused = bool(flat) and all(_fusable(p) for p in flat)
    return _AdamW(params, fused=fused, foreach=not fused, **options)


def _fusable(p: torch.Tensor) -> bool:
    local = local_tensor(p)
    return local.device.type in ("cpu", "cuda") and local.dtype in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
    )


class _AdamW(torch.optim.AdamW):
    """AdamW whose step runs on the local tensors of DTensor parameters, gradients and
    states. AdamW is elementwise, so this is the same update; the state stays DTensors (the
    checkpoint and any other layout see them as usual). Through DTensor, the foreach update
    ran sharding propagation on every call (not cached: ~10% of a rank's time on 4 CPU
    ranks), and foreach refused a group mixing DTensors with tensors. Keeps its own
    ``foreach`` / ``fused`` choice when it loads a state dict: a checkpoint saved by another
    layout or version (sharding.load_full_role_state) carries that one's choice."""

    def load_state_dict(self, state_dict: dict) -> None:
        keep = [(g.get("foreach"), g.get("fused")) for g in self.param_groups]
        groups = [dict(g) for g in state_dict["param_groups"]]
        for g, (foreach, fused) in zip(groups, keep, strict=True):
            g["foreach"], g["fused"] = foreach, fused  # before the load: it places "step" by it
        super().load_state_dict({**state_dict, "param_groups": groups})

    @torch.no_grad()
    def step(self, closure=None, owned=None):
        """One AdamW update. ``owned`` (a :class:`rpeg.runtime.pair_update.PairSplit`): only
        this rank's elements of each parameter it covers are updated (1-D views of the
        parameter, its gradient and moments; AdamW is elementwise), a parameter wholly the
        peer's only advances its step count; parameters it does not cover update whole."""
        if closure is not None or any(g["differentiable"] for g in self.param_groups):
            if owned is not None:
                raise ValueError("a split update runs no closure and no differentiable step")
            return super().step(closure)
        from torch.optim.adam import adam

        def local(ts: list[torch.Tensor]) -> list[torch.Tensor]:
            return [local_tensor(t) for t in ts]

        for group in self.param_groups:
            lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
            has_complex = self._init_group(group, *lists)  # creates state, fills the lists
            if owned is not None:
                lists = _owned_lists(lists, owned)
            beta1, beta2 = group["betas"]
            for chunk in _chunks(tuple(local(x) for x in lists), OPTIMIZER_CHUNK_BYTES):
                adam(
                    *chunk,
                    amsgrad=group["amsgrad"],
                    has_complex=has_complex,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=group["maximize"],
                    foreach=group["foreach"],
                    capturable=group["capturable"],
                    differentiable=False,
                    fused=group["fused"],
                    decoupled_weight_decay=group["decoupled_weight_decay"],
                )
        return None


def _owned_lists(lists: tuple[list[torch.Tensor], ...], owned) -> tuple[list[torch.Tensor], ...]:
    """AdamW's aligned lists (params, grads, m, v, max v, steps) cut to ``owned``'s elements:
    a covered parameter's tensors as 1-D views of its own span (its step tensor whole, one
    per parameter), a parameter wholly the peer's left out, its step advanced here."""
    params, steps = lists[0], lists[5]
    out: tuple[list[torch.Tensor], ...] = tuple([] for _ in lists)
    skipped = []
    for i, p in enumerate(params):
        span = owned.owned(p) if owned.covers(p) else None  # None and covered: the peer's
        if span is None and owned.covers(p):
            skipped.append(steps[i])
            continue
        for j, x in enumerate(lists):
            if len(x) != len(params):  # max v without amsgrad: empty
                continue
            t = x[i]
            if span is not None and j != 5:
                t = t.view(-1)[span[0] : span[1]]
            out[j].append(t)
    if skipped:
        torch._foreach_add_(skipped, 1)
    return out


#: parameter bytes per multi-tensor AdamW call: the foreach update allocates temporaries the
#: size of the tensors it is given (sqrt of the second moment, the step), so one call over a
#: rank's whole shard held another copy of it at the step (0.6 GB of a 302M-parameter model
#: at fsdp dp=2); in chunks the transient is a chunk's (or the largest tensor's)
OPTIMIZER_CHUNK_BYTES = 64 * 2**20


def _chunks(lists: tuple[list[torch.Tensor], ...], limit: int):
    """The aligned lists of one AdamW call (params, grads, moments, steps) cut into runs of
    whole tensors holding at most ``limit`` parameter bytes each (a larger tensor alone)."""
    params = lists[0]
    start, size = 0, 0
    for i, p in enumerate(params):
        n = p.numel() * p.element_size()
        if i > start and size + n > limit:
            yield tuple(x[start:i] if len(x) == len(params) else x for x in lists)
            start, size = i, 0
        size += n
    if start < len(params):
        yield tuple(x[start:] if len(x) == len(params) else x for x in lists)
