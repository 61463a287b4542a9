"""Shards of a model role over a ``("dp", "tp")`` device mesh: DTensor tensor parallelism and
FSDP2 data-parallel sharding of the Hugging Face Llama / Qwen2 / Qwen3 decoders the engine loads.

A group of ``world_size = dp * tp`` ranks lays its ranks out row-major on the mesh: rank
``r`` is data-parallel index ``r // tp`` and tensor-parallel index ``r % tp``. The ``tp`` ranks
of one data-parallel index see the same samples (and run the same decode with the same
sampling seed); the ``dp`` indices see different shards of the batch.

* :func:`rpeg.runtime.mesh.build_mesh` -- the :class:`~torch.distributed.device_mesh.DeviceMesh` of a
  :class:`Layout` over the already-initialized default process group.
* :func:`rpeg.runtime.tensor_parallel.apply_tensor_parallel` -- column-wise q/k/v/gate/up, row-wise o/down in every decoder
  block (Megatron-LM's split, Shoeybi et al. 2019, arXiv:1909.08053), as DTensor parameters
  with plain-tensor activations (:mod:`rpeg.runtime.tensor_parallel`). The HF attention
  reshapes with ``view(..., -1, head_dim)`` and ``reshape(..., -1)`` (transformers 5.x), so
  with local activations each rank simply runs ``heads / tp`` heads; embeddings, norms and
  the LM head stay replicated.
* :func:`apply_fsdp` -- ``fully_shard`` per group of consecutive decoder blocks holding at
  least :data:`FSDP_UNIT_BYTES` (one block each at 7B scale; the whole trunk of a small
  model), plus the root, over the ``dp`` mesh (composes with TP: parameters become 2-D
  DTensors).
* :func:`shard_roles` / :class:`Shards` -- what a rank does to one role (actor, reference,
  critic) and the collective helpers the training loop needs afterwards: gradient
  averaging for replicated parameters, gradient-norm clipping over DTensors.
* :func:`full_state_dict` / :func:`load_full_state_dict` -- unsharded weights out and in
  (weight sync, evaluation, export); :func:`full_role_state` / :func:`load_full_role_state`
  add the optimizer state keyed by parameter names (a checkpoint any layout loads). All are
  collectives: every rank of the group calls them.
* :func:`gathered_blocks` -- FSDP blocks gathered once for a whole decode loop.
* :func:`param_bytes_local` / :func:`param_bytes_full` -- what this rank holds vs. the model.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rpeg.errors import ConfigError
from rpeg.perf.rank_memory import FSDP_SPLIT_BYTES as _SPLIT_BYTES
from rpeg.perf.rank_memory import FSDP_UNIT_BYTES as _UNIT_BYTES
from rpeg.runtime.mesh import Layout, build_mesh, layout_problems, process_group_backend  # noqa: F401 -- for tests, benchmarks
from rpeg.runtime.model_io.architectures import decoder_layers
from rpeg.runtime.tensor_parallel import apply_tensor_parallel, sum_partial_grads

# DTensor warns on every 2-D (dp x tp) norm / gather that it runs one collective per mesh
# dimension; that is what a 2-D layout costs here, not a problem to report each step
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


# --- FSDP2 ---------------------------------------------------------------------------------
#: least parameter bytes (this rank's, before FSDP) of one FSDP unit: consecutive decoder
#: blocks are grouped until they reach it, blocks left over join the root. Every unit costs
#: an all-gather in forward, one in backward and a reduce-scatter per micro-batch, plus its
#: hooks; at rpeg-tiny's size (4 blocks of 4 MiB) per-block units were 232 ms per optimizer
#: step on 4 CPU ranks vs 158 ms for one unit (docs/measurements.md). The price is
#: the transient memory of one gathered unit. 25 MiB is DDP's bucket (Li et al. 2020,
#: arXiv:2006.15704); any block of a 0.5B+ model in bf16 is past it, so those keep one unit
#: per block as torchtitan wraps them.
FSDP_UNIT_BYTES = _UNIT_BYTES  # one definition: the memory model prices the same units


#: a decoder block holding more parameter bytes than this (this rank's) is sharded as smaller
#: units inside it (:func:`block_parts`): its attention and MLP, and the MLP's (or
#: attention's) own matrices while those are past it too. FSDP's transient buffers (the
#: computing unit, the prefetched one, a unit's gradients, the collectives' staging: about
#: five units in training) shrink with the largest unit: at the 302M model's fp32 blocks of
#: 151 MB, fsdp dp=2, a rank's training peak fell from 4.28 to 4.01 GB with attention + MLP
#: units and further with the MLP's three matrices (docs/measurements.md)
FSDP_SPLIT_BYTES = _SPLIT_BYTES


def block_parts(module: nn.Module) -> list[nn.Module]:
    """The inner units of a decoder block past :data:`FSDP_SPLIT_BYTES`, innermost first:
    each child holding at least a sixteenth of that (norms stay with the block), split again
    while it is past it; a child whose parameters all went to its own children is no unit."""
    if param_bytes_local(module) <= FSDP_SPLIT_BYTES:
        return []
    out: list[nn.Module] = []
    for child in module.children():
        if param_bytes_local(child) < FSDP_SPLIT_BYTES // 16:
            continue
        inner = block_parts(child)
        out += inner
        if not inner or next(child.parameters(recurse=False), None) is not None:
            out.append(child)
    return out


def fsdp_units(blocks: list[nn.Module], unit_bytes: int | None = None) -> list[list[nn.Module]]:
    """``blocks`` cut, in order, into groups of at least ``unit_bytes`` (default
    :data:`FSDP_UNIT_BYTES`) parameter bytes each; a tail under it is left out (it joins the
    root unit)."""
    unit_bytes = FSDP_UNIT_BYTES if unit_bytes is None else unit_bytes
    units: list[list[nn.Module]] = []
    cur: list[nn.Module] = []
    size = 0
    for b in blocks:
        cur.append(b)
        size += param_bytes_local(b)
        if size >= unit_bytes:
            units.append(cur)
            cur, size = [], 0
    return units


def apply_fsdp(
    module: nn.Module,
    dp_mesh,
    extra_roots: Iterable[nn.Module] = (),
    unit_bytes: int | None = None,
    mp_policy=None,
    ignored: set[nn.Parameter] | None = None,
) -> None:
    """``fully_shard`` the attention and MLP of each block past :data:`FSDP_SPLIT_BYTES`
    (:func:`block_parts`), each group of decoder blocks of :func:`fsdp_units`, then ``module``
    (the root: embeddings, final norm, LM head, blocks in no group), then each of
    ``extra_roots`` (value heads that live beside the LM). Every unit, the root too,
    reshards after forward (FSDP2 keeps a root gathered from forward to backward by default;
    here the root may hold the whole trunk of a small model, and a rank holds only its shard
    between stages -- what the summary's parameter bytes and the planner's memory assume);
    the root's extra all-gather in backward cost ~5 ms of ~205 per optimizer step at
    rpeg-tiny on 4 CPU ranks. ``mp_policy``: FSDP2's ``MixedPrecisionPolicy`` of every unit
    (:func:`rpeg.runtime.precision.fsdp_policy`: bf16 gathers, fp32 gradient reduction; None:
    everything in the parameters' dtype). ``ignored``: parameters FSDP leaves alone (experts
    split over ep: rpeg.runtime.expert_parallel); a part holding only those is no unit."""
    from torch.distributed.fsdp import fully_shard

    from rpeg.runtime.pair_channel import use_pair_comms

    units = [u if len(u) > 1 else u[0] for u in fsdp_units(decoder_layers(module), unit_bytes)]
    parts = [p for u in units if not isinstance(u, list) for p in block_parts(u)]
    if ignored:
        skip = {id(q) for q in ignored}
        parts = [p for p in parts if any(id(q) not in skip for q in p.parameters())]
    for m in [*parts, *units, module, *extra_roots]:
        kw: dict[str, Any] = {} if mp_policy is None else {"mp_policy": mp_policy}
        if ignored:
            kw["ignored_params"] = ignored
        fully_shard(m, mesh=dp_mesh, reshard_after_forward=True, **kw)
        use_pair_comms(m[0] if isinstance(m, list) else m, dp_mesh)


@contextlib.contextmanager
def gathered_blocks(module: nn.Module) -> Iterator[None]:
    """While inside, every FSDP2 unit of ``module`` (its decoder blocks and the root:
    embeddings, final norm, LM head) stays unsharded after its first forward
    (``set_reshard_after_forward(False)``), so a decode loop gathers each unit once, not once
    per token, and after the first forward runs no collective over dp: ranks with different
    prompts stop at their own lengths. They are resharded on exit (and reshard after
    every forward again). A no-op for a model without FSDP."""
    from torch.distributed.fsdp import FSDPModule

    try:
        units = [b for b in decoder_layers(module) if isinstance(b, FSDPModule)]
    except TypeError:
        units = []
    if isinstance(module, FSDPModule):
        units.append(module)
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(True, recurse=False)


# --- one role ------------------------------------------------------------------------------
#: bytes of gradients per data-parallel all-reduce (DDP's default bucket is 25 MiB)
GRAD_BUCKET_BYTES = 25 * 2**20


def grad_buckets(grads: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """``grads`` in order, cut into buckets of one dtype and device holding at most
    ``bucket_bytes`` each (a larger tensor forms its own bucket)."""
    out: list[list[torch.Tensor]] = []
    cur: list[torch.Tensor] = []
    size = 0
    for g in grads:
        n = g.numel() * g.element_size()
        same = cur and (cur[0].dtype, cur[0].device) == (g.dtype, g.device)
        if cur and (not same or size + n > bucket_bytes):
            out.append(cur)
            cur, size = [], 0
        cur.append(g)
        size += n
    if cur:
        out.append(cur)
    return out


@dataclass
class Shards:
    """How one rank holds a role: the mesh, the layout, and the collective steps its training
    loop needs. ``replicated``: parameters no FSDP unit reduces (everything without fsdp, the
    value head beside an unsharded LM) whose gradients are averaged over ``dp`` by
    :meth:`sync_grads`."""

    layout: Layout
    mesh: Any = None
    replicated: list[nn.Parameter] = field(default_factory=list)
    tp_split: nn.Module | None = None  # the tp-split LM (its LoRA factors' partial grads)
    experts: Any = None  # experts split over ep (rpeg.runtime.expert_parallel.ExpertShards)
    #: the RankReduce a decode gathering per forward runs in lockstep over (None: the role's
    #: dp reduce); FSDP over dp x cp: every rank of the mesh (rpeg.runtime.context_parallel)
    lockstep: Any = None
    #: a same-host pair's split update (rpeg.runtime.pair_update.PairSplit), made at the
    #: first gradient sum that can use it; ``split_update``: the split the current update
    #: runs on (set by :meth:`sync_grads`, read by clipping and the optimizer step)
    split: Any = field(default=None, repr=False)
    split_update: Any = field(default=None, repr=False)
    _split_checked: bool = field(default=False, repr=False)

    @property
    def dp_group(self):
        return None if self.mesh is None else self.mesh.get_group("dp")

    def _pair_split(self, pair, group):
        """The pair's :class:`PairSplit` of :attr:`replicated` where the layout is two plain
        replicas (dp=2, no FSDP, tp, pp, cp or expert split) of CPU tensors of one dtype;
        decided once (both ranks decide alike: the same layout and parameters)."""
        if not self._split_checked:
            self._split_checked = True
            from rpeg.runtime.pair_update import PairSplit

            lay = self.layout
            plain = (lay.dp, lay.tp, lay.pp, lay.cp, lay.ep) == (2, 1, 1, 1, 1) and not lay.fsdp
            if plain and self.experts is None and PairSplit.usable(self.replicated):
                import torch.distributed as dist

                me = dist.get_group_rank(group, dist.get_rank())
                self.split = PairSplit(self.replicated, pair, me)
        return self.split

    def consolidate(self, optimizer) -> None:
        """Before a checkpoint reads ``optimizer``: a split pair's moments made whole on both
        ranks (:meth:`PairSplit.consolidate`; a collective of the pair). A no-op otherwise."""
        if self.split is not None and optimizer is not None:
            self.split.consolidate(optimizer)

    def sync_grads(self, bucket_bytes: int = GRAD_BUCKET_BYTES) -> None:
        """Average the gradients of :attr:`replicated` parameters over the ``dp`` ranks: one
        all-reduce per bucket of about ``bucket_bytes`` (gradients flattened by dtype, all
        buckets in flight at once, then copied back), not one per parameter -- a collective's
        fixed cost (gloo over loopback: ~0.3 ms) paid once per bucket (DDP's bucketing, Li
        et al. 2020, arXiv:2006.15704). A pair of CPU ranks on one host sums each bucket over
        its pair channel instead (rpeg.runtime.pair_channel: the peer's bytes added straight
        from shared memory, no hand-off to gloo's threads; measured on rpeg-tiny's dp=2 train
        step: docs/measurements.md); two plain replicas sum only their own half
        (:meth:`_pair_split`: the update then runs in halves, :attr:`split_update`). First the
        LoRA tp sums (:attr:`tp_split`)."""
        self.split_update = None
        sum_partial_grads(self.tp_split)
        if self.experts is not None:  # summed over their replicas, / dp; the live replicas
            self.replicated = self.experts.sync_grads(self.replicated)
        if self.layout.dp <= 1 or not self.replicated:
            return
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        from rpeg.runtime.pair_channel import pair_channel

        grads = [
            p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
            for p in self.replicated
            if p.grad is not None
        ]
        group = self.dp_group
        pair = pair_channel(group) if grads and grads[0].device.type == "cpu" else None
        if pair is not None and all(g.is_contiguous() for g in grads):
            split = self._pair_split(pair, group) if self.tp_split is None else None
            if split is not None:  # each rank sums its half; clip and AdamW over it
                split.reduce_scatter(divide=float(self.layout.dp))
                self.split_update = split
                return
            # a same-host pair: the peer's gradients added in place from shared memory
            for bucket in grad_buckets(grads, bucket_bytes):
                pair.exchange_sum_(bucket, divide=float(self.layout.dp))
            return
        pending = []
        for bucket in grad_buckets(grads, bucket_bytes):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            pending.append((bucket, flat, dist.all_reduce(flat, group=group, async_op=True)))
        for bucket, flat, work in pending:
            work.wait()
            flat.div_(self.layout.dp)
            a = 0
            for g in bucket:
                g.copy_(flat[a : a + g.numel()].view_as(g))
                a += g.numel()

    def clip_grads(self, params: Iterable[nn.Parameter], max_norm: float) -> float:
        if self.split_update is not None:  # the pair's halves: each clips its own
            return self.split_update.clip(max_norm)
        return grad_norm_and_clip(params, max_norm)

    def training_pass(self, module: nn.Module) -> contextlib.AbstractContextManager:
        """The context of a role's training updates: with FSDP over dp > 1 and
        ``layout.reshard_after_forward`` False, every unit of ``module`` stays gathered from
        its forward to its backward (:func:`gathered_blocks`; FSDP2 still reshards it after
        backward), so a micro-batch all-gathers each unit once instead of twice -- the
        rank's whole unsharded shard is resident during the pass (the plan's choice,
        ``reshard_after_forward``). Measured at ``configs/sharded-cpu.yaml`` (rpeg-tiny,
        tp=2 x fsdp dp=2 on 2 cores): the train stage 0.566 -> 0.483 s, the same gradients
        (docs/parallelism.md "Shards", the FSDP2 item)."""
        lay = self.layout
        if lay.fsdp and lay.dp > 1 and not lay.reshard_after_forward:
            return gathered_blocks(module)
        return contextlib.nullcontext()


def grad_norm_and_clip(params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Global L2 norm of the gradients (plain tensors and DTensors of any mesh), then scale
    them by ``min(1, max_norm / (norm + 1e-6))`` -- ``torch.nn.utils.clip_grad_norm_``'s rule.

    Plain gradients (replicated on every rank) count once. A DTensor's squared norm is its
    local shard's, divided by how many ranks of its mesh replicate it (``Replicate`` dims),
    summed over the mesh by one scalar all-reduce per mesh dimension
    (:func:`rpeg.runtime.tensor_parallel.tp_all_reduce`); per-tensor norms come from one
    ``_foreach_norm``. So every rank of the group must call this in the same order."""
    from torch.distributed.tensor import DTensor

    from rpeg.runtime.tensor_parallel import tp_all_reduce

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    plain = [g.detach() for g in grads if not isinstance(g, DTensor)]
    by_mesh: dict[int, list] = {}
    for g in grads:
        if isinstance(g, DTensor):
            by_mesh.setdefault(id(g.device_mesh), []).append(g)
    sq = torch.zeros((), dtype=torch.float64)
    if plain:
        sq += torch.stack(torch._foreach_norm(plain)).double().pow(2).sum().cpu()
    for group in by_mesh.values():
        mesh = group[0].device_mesh
        local = [g._local_tensor.detach() for g in group]
        norms = torch.stack(torch._foreach_norm(local)).double()
        rep = torch.tensor(
            [
                math.prod(mesh.size(d) for d, pl in enumerate(g.placements) if pl.is_replicate())
                for g in group
            ],
            dtype=torch.float64,
            device=norms.device,
        )
        part = (norms.pow(2) / rep).sum().reshape(1)  # on the grads' device (NCCL needs it)
        for dim in range(mesh.ndim):
            if mesh.size(dim) > 1:
                part = tp_all_reduce(part, mesh.get_group(dim))
        sq += part[0].cpu()
    total = float(sq.sqrt())
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        if plain:
            torch._foreach_mul_(plain, coef)
        for group in by_mesh.values():
            torch._foreach_mul_([g._local_tensor.detach() for g in group], coef)
    return total


def shard_roles(
    module: nn.Module,
    lm: nn.Module,
    layout: Layout,
    mesh,
    *,
    heads: Iterable[nn.Module] = (),
) -> Shards:
    """Shard one role in place: tensor parallelism of ``lm``'s (or a critic trunk's) blocks
    over ``mesh["tp"]``, then FSDP2 over ``mesh["dp"]`` when ``layout.fsdp`` (``heads``: value
    heads beside the LM, each its own FSDP root). ``module`` is what the loss calls (the LM, an
    actor-critic or a critic); returns the role's :class:`Shards`. FSDP units gather in
    ``layout.dtype`` and reduce gradients in fp32 (:func:`rpeg.runtime.precision.fsdp_policy`);
    replicated gradients are averaged in the parameters' dtype (fp32 masters)."""
    from rpeg.runtime.model_io import torch_dtype
    from rpeg.runtime.precision import fsdp_policy

    heads = list(heads)
    if layout.tp > 1:
        cfg = getattr(lm, "config", None)
        probs = layout_problems(cfg, layout.tp) if cfg is not None else []
        if probs:
            raise ConfigError(probs, title="the layout does not divide the model")
        apply_tensor_parallel(lm, mesh["tp"])
    from rpeg.runtime.expert_parallel import expert_shards

    experts = expert_shards(module, lm, layout)  # ep > 1: each rank's experts, all-to-all dispatch
    split = set(experts.params) if experts is not None else set()
    split_ids = {id(p) for p in split}
    replicated: list[nn.Parameter] = []
    if layout.fsdp and layout.dp > 1:
        apply_fsdp(
            lm,
            mesh["dp"],
            extra_roots=heads,
            mp_policy=fsdp_policy(torch_dtype(layout.dtype)),
            ignored=split,
        )
    else:
        replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in split_ids]
    return Shards(layout, mesh, replicated, lm if layout.tp > 1 else None, experts)


# --- full weights in and out ---------------------------------------------------------------
def full_state_dict(
    model: nn.Module, dtype: torch.dtype | None = None, *, keep_device: bool = False
) -> dict[str, torch.Tensor]:
    """The unsharded state dict of ``model`` on every rank, as detached CPU copies (DTensors
    are gathered with ``full_tensor``), floating-point tensors cast to ``dtype`` when given
    (before the gather: a bf16 gather moves half the bytes of fp32 masters). Collective:
    every rank of the model's mesh calls it in the same order. Plain (unsharded) models just
    get copied. ``keep_device``: tensors on a device stay there (weight sync between GPUs:
    no host round trip; a plain model's unconverted tensors are then detached views of its
    own, to be read before the next update)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for k, v in model.state_dict().items():
        if dtype is not None and v.is_floating_point() and v.dtype != dtype:
            v = v.detach().to(dtype)
        if isinstance(v, DTensor):
            v = v.full_tensor()
        if keep_device and v.device.type != "cpu":
            out[k] = v.detach()
        else:
            out[k] = v.detach().cpu().clone()
    return out


def full_tensor_source(model: nn.Module, dtype: torch.dtype | None = None):
    """``(meta, fetch)`` of ``model``'s unsharded state: ``meta[name] = (full shape, dtype)``
    (floating tensors in ``dtype`` when given) and ``fetch(name)`` -> that full tensor on the
    model's device (a DTensor gathered then, cast before the gather). For weight sync
    (rpeg.runtime.actors.weight_sync.stream_buckets): one gathered tensor alive at a time.
    Every rank of the mesh must fetch the same names in the same order."""
    from torch.distributed.tensor import DTensor

    state = model.state_dict()

    def target(v: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and v.is_floating_point() else v.dtype

    meta = {k: (tuple(v.shape), target(v)) for k, v in state.items()}

    def fetch(name: str) -> torch.Tensor:
        v = state[name].detach()
        v = v.to(target(v))
        return v.full_tensor() if isinstance(v, DTensor) else v

    return meta, fetch


def load_tensors(model: nn.Module, names: Iterable[str], fetch) -> None:
    """Load full tensors into a sharded or plain ``model`` one at a time: ``fetch(name)`` gives
    each (on any device, in any dtype), the model keeps its slice and the full tensor is
    dropped before the next (a weight sync that never holds a second copy of the model).
    Every name of the model's state must come. Collective when ``fetch`` is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    own = model.state_dict()
    seen: set[str] = set()
    with torch.no_grad():
        for k in names:
            cur = own.get(k)
            if cur is None:
                raise KeyError(f"state dict mismatch: unexpected {k}")
            src = fetch(k)
            if isinstance(cur, DTensor):
                full = src.to(device=cur._local_tensor.device, dtype=cur.dtype)
                d = distribute_tensor(full, cur.device_mesh, cur.placements, src_data_rank=None)
                cur._local_tensor.copy_(d._local_tensor)
            else:
                cur.copy_(src.to(device=cur.device, dtype=cur.dtype))
            seen.add(k)
            del src
    missing = sorted(set(own) - seen)
    if missing:
        raise KeyError(f"state dict mismatch: missing {missing[:5]}")


def load_full_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load an unsharded ``state`` (every rank holds the whole of it) into a sharded or plain
    ``model``: each DTensor takes its local slice, no communication. Strict on keys."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise KeyError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    load_tensors(model, list(own), state.__getitem__)


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def full_role_state(module: nn.Module, optimizer) -> tuple[dict, dict | None]:
    """(full weights, full optimizer state keyed by parameter names) of a sharded role, on
    CPU: what a layout-independent ``torch.save`` checkpoint holds. Collective. The optimizer
    state is gathered one tensor at a time straight to the host of rank 0 (``cpu_offload``);
    the other ranks get an empty dict (:func:`load_full_role_state` broadcasts rank 0's)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    osd = None
    if optimizer is not None:
        # cpu_offload: each gathered tensor goes to the host at once (rank 0 keeps it, the
        # others drop it), so no device ever holds the whole optimizer state
        osd = _to_cpu(
            get_optimizer_state_dict(
                module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        )
    return full_state_dict(module), osd


def load_full_role_state(module: nn.Module, optimizer, weights: dict, optim: dict | None) -> None:
    """Load what :func:`full_role_state` returned (from any layout) into a sharded role. The
    optimizer state is rank 0's, broadcast to the others tensor by tensor (every rank calls
    this; the others' ``optim`` may be empty)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    load_full_state_dict(module, weights)
    if optimizer is not None and optim is not None:
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=dist.is_initialized())
        set_optimizer_state_dict(module, optimizer, optim, options=opts)


def param_bytes_local(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (a DTensor counts its local shard; a tied
    parameter counts once)."""
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        t = p._local_tensor if isinstance(p, DTensor) else p
        total += t.numel() * t.element_size()
    return total


def param_bytes_full(model: nn.Module) -> int:
    """Bytes of the full (unsharded) parameters of ``model`` (tied parameters once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total
