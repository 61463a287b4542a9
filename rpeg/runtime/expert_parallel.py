"""Expert parallelism: the experts of every mixture-of-experts layer split over ``ep`` ranks,
tokens dispatched to the rank holding their expert and combined back with all-to-all.

Each of the ``ep`` ranks runs its own tokens (its data-parallel share) through the replicated
non-expert layers; in each MoE layer the router runs locally, then (GShard, Lepikhin et al.
2020, arXiv:2006.16668; the layout of Megatron-LM's and torchtitan's expert parallelism):

1. every (token, top-k slot) assignment is sent to the rank holding its expert (rank
   ``e // (E / ep)``): one ``all_to_all_single`` of the counts, one of the hidden states and
   one of the local expert ids;
2. the rank runs its ``E / ep`` experts on what it received, with the experts module's own
   forward (transformers' code: Qwen3-MoE, Mixtral, Qwen3-Next, gpt-oss experts), each row
   as a top-1 assignment of weight 1;
3. the outputs go back by the reverse all-to-all and are weighted and summed per token on the
   token's rank (so the router's gradient stays local).

The all-to-alls are differentiable (:class:`_AllToAll`: the backward is the reverse
exchange), so the experts' gradients sum every rank's tokens: with each rank's loss scaled
by its share of the global batch, a local expert's gradient is the one-process gradient, and
the replicated (non-expert) parameters' gradients are summed over the group
(:func:`sum_replicated_grads`). gloo runs ``all_to_all_single`` on CPU tensors.

In a compiled step (``GroupSpec.ep``; rpeg.runtime.sharding.shard_roles calls
:func:`shard_experts`) the expert-indexed parameters become DTensors ``Shard(0)`` over the rank's
ep group of an ``("edp", "ep", "tp")`` DeviceMesh (:func:`ep_mesh`: ``ep`` consecutive dp indices
form an ep group; ``edp = dp / ep`` groups hold the same experts), so what works on DTensors
works on them unchanged: the meta-device build fills each rank's experts only
(rpeg.runtime.materialize), ``full_tensor`` gathers them for weight sync, evaluation and export,
torch.distributed.checkpoint saves them under the unsplit names and reloads them at another ep,
the gradient norm sums them over ep, AdamW updates their local rows. FSDP2 ignores them
(``ignored_params``: FSDP shards the non-expert parameters over dp); their gradients, the sum of
the ep group's tokens, are summed over the ``edp`` replicas and divided by dp
(:class:`ExpertShards`), as FSDP's reduce-scatter averages the others. Every forward of a split
model is a collective over its ep group: decode runs in lockstep (rpeg.runtime.roles).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: attribute marking an experts module split by :func:`apply_expert_parallel`
EP_ATTR = "rpeg_ep"


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows ``x`` (``send[i]`` rows to rank ``i``, ``recv[i]`` from
    it); backward: the reverse exchange of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group: Any):
        import torch.distributed as dist

        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(
            out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group
        )
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        import torch.distributed as dist

        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(
            out,
            grad.contiguous(),
            output_split_sizes=ctx.send,
            input_split_sizes=ctx.recv,
            group=ctx.group,
        )
        return out, None, None, None


def experts_modules(model: nn.Module) -> list[nn.Module]:
    """The experts modules of ``model`` (transformers' fused ``*Experts``: 3-D expert weights
    indexed by expert, a ``num_experts`` attribute), in module order."""
    return [
        m
        for m in model.modules()
        if type(m).__name__.endswith("Experts") and isinstance(getattr(m, "num_experts", None), int)
    ]


def ep_problems(config: Any, ep: int, where: str = "plan.layout.ep") -> list:
    """Why the model of ``config`` cannot split its experts over ``ep`` ranks."""
    from rpeg.errors import Problem
    from rpeg.runtime.model_io.moe import num_experts

    if ep <= 1:
        return []
    mt = getattr(config, "model_type", "?")
    e = num_experts(config)
    if not e:
        return [Problem(where, f"model_type {mt!r} has no experts to split at ep={ep}")]
    if e % ep:
        why = f"ep does not divide its {e} experts"
        return [Problem(where, f"model_type {mt!r} cannot run at ep={ep}: {why}")]
    return []


def apply_expert_parallel(model: nn.Module, group: Any) -> None:
    """Split the experts of every MoE layer of ``model`` over the ranks of ``group`` (in
    place): rank ``r`` keeps experts ``r*E/ep .. (r+1)*E/ep - 1`` (its slice of every
    expert-indexed parameter) and dispatches tokens by all-to-all in forward."""
    import torch.distributed as dist

    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    for m in experts_modules(model):
        e = m.num_experts
        if e % ep:
            raise ValueError(f"{type(m).__name__}: ep={ep} does not divide its {e} experts")
        n = e // ep
        with torch.no_grad():
            for name, p in list(m.named_parameters(recurse=False)):
                if p.dim() >= 1 and p.shape[0] == e:
                    local = p.detach()[rank * n : (rank + 1) * n].clone()
                    m.register_parameter(name, nn.Parameter(local, requires_grad=p.requires_grad))
        m.num_experts = n
        info = {"group": group, "ep": ep, "rank": rank, "local": n, "forward": type(m).forward}
        setattr(m, EP_ATTR, info)
        m.__class__ = _ep_class(type(m))


_CLASSES: dict[type, type] = {}


def _ep_class(base: type) -> type:
    """``base`` with :func:`_ep_forward` as its forward (one subclass per experts class)."""
    if base not in _CLASSES:
        _CLASSES[base] = type(f"EP{base.__name__}", (base,), {"forward": _ep_forward})
    return _CLASSES[base]


def _ep_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights):
    """Dispatch, compute on the local experts, combine (module doc)."""
    import torch.distributed as dist

    ep_info = getattr(self, EP_ATTR)
    group, ep, n = ep_info["group"], ep_info["ep"], ep_info["local"]
    tokens, k = top_k_index.shape
    flat_e = top_k_index.reshape(-1)
    flat_tok = torch.arange(tokens, device=flat_e.device).repeat_interleave(k)
    dest = torch.div(flat_e, n, rounding_mode="floor")
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    local_e = (flat_e - dest * n)[order]
    e_recv = local_e.new_empty(sum(recv))
    dist.all_to_all_single(
        e_recv, local_e.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group
    )
    x_recv = _AllToAll.apply(hidden_states[flat_tok[order]], send, recv, group)
    ones = torch.ones((x_recv.shape[0], 1), dtype=x_recv.dtype, device=x_recv.device)
    split = ep_info.get("params", ())
    held = {name: self._parameters[name] for name in split}
    try:  # DTensor experts: the module's own forward on their local rows (grads flow back)
        for name, p in held.items():
            self._parameters[name] = p.to_local()  # type: ignore[assignment]
        y_recv = ep_info["forward"](self, x_recv, e_recv[:, None], ones)
    finally:
        self._parameters.update(held)
    y = _AllToAll.apply(y_recv, recv, send, group)
    w = top_k_weights.reshape(-1)[order].to(y.dtype)
    out = torch.zeros_like(hidden_states)
    return out.index_add(0, flat_tok[order], y * w[:, None])


def sum_replicated_grads(model: nn.Module, group: Any) -> None:
    """Sum the gradients of ``model``'s parameters outside its split experts over ``group``
    (each rank's loss already carries its share of the global batch)."""
    import torch.distributed as dist

    split = {
        id(p)
        for m in experts_modules(model)
        if hasattr(m, EP_ATTR)
        for p in m.parameters(recurse=False)
    }
    for p in model.parameters():
        if id(p) in split or p.grad is None:
            continue
        dist.all_reduce(p.grad, group=group)


# --- the compiled step's expert parallelism (rpeg.runtime.sharding.shard_roles) -------------
_MESHES: dict[tuple, Any] = {}


def ep_mesh(layout: Any):
    """The ``("edp", "ep", "tp")`` DeviceMesh of ``layout`` over the default process group:
    rank ``r`` (dp index ``r // tp``) is in ep group ``(r // tp) // ep`` at ep index
    ``(r // tp) % ep`` -- ``ep`` consecutive dp indices of the same tp index. One per layout
    and process group (the roles of a rank share it)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if layout.pp > 1 or layout.cp > 1:
        raise ValueError(f"expert parallelism with pp={layout.pp}, cp={layout.cp}: not run")
    if layout.dp % layout.ep:
        raise ValueError(f"ep={layout.ep} does not divide dp={layout.dp}")
    key = (id(dist.group.WORLD), layout.device_type, layout.dp, layout.ep, layout.tp)
    if key not in _MESHES:
        shape = (layout.dp // layout.ep, layout.ep, layout.tp)
        _MESHES[key] = init_device_mesh(
            layout.device_type, shape, mesh_dim_names=("edp", "ep", "tp")
        )
    return _MESHES[key]


def shard_experts(model: nn.Module, mesh: Any) -> list[nn.Parameter]:
    """Split the experts of every MoE layer of ``model`` over ``mesh["ep"]`` (in place, on the
    meta device or not): each expert-indexed parameter becomes a DTensor ``Shard(0)`` holding
    this rank's ``E / ep`` experts, and the experts module dispatches tokens by all-to-all
    (:func:`_ep_forward`). Returns the split parameters."""
    from torch.distributed.tensor import DTensor, Shard

    sub = mesh["ep"]
    ep, rank = sub.size(), sub.get_local_rank()
    out: list[nn.Parameter] = []
    for m in experts_modules(model):
        if hasattr(m, EP_ATTR):
            raise ValueError(f"{type(m).__name__} is split already")
        e = m.num_experts
        if e % ep:
            raise ValueError(f"{type(m).__name__}: ep={ep} does not divide its {e} experts")
        n = e // ep
        names = []
        with torch.no_grad():
            for name, p in list(m.named_parameters(recurse=False)):
                if isinstance(p, DTensor) or p.dim() < 1 or p.shape[0] != e:
                    continue
                local = p.detach()[rank * n : (rank + 1) * n]
                local = local if local.is_meta else local.clone()
                dt = DTensor.from_local(
                    local, sub, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride()
                )
                q = nn.Parameter(dt, requires_grad=p.requires_grad)
                m.register_parameter(name, q)
                names.append(name)
                out.append(q)
        m.num_experts = n
        info = {
            "group": sub.get_group(),
            "ep": ep,
            "rank": rank,
            "local": n,
            "forward": type(m).forward,
            "params": tuple(names),
        }
        setattr(m, EP_ATTR, info)
        m.__class__ = _ep_class(type(m))
    return out


def is_split(model: Any) -> bool:
    """Whether ``model`` has experts split over ranks (its forwards are collectives)."""
    return isinstance(model, nn.Module) and any(hasattr(m, EP_ATTR) for m in model.modules())


class ExpertShards:
    """The split experts of one role and the step their gradients need before clipping:
    each expert's gradient holds the ep group's tokens (the all-to-all's backward), each
    rank's loss carrying ``dp`` x its share of the global batch (the dp average's
    convention); summed over the ``edp`` groups that hold the same experts and divided by
    ``dp`` it is the one-process gradient. The parameters are looked up when used: giving
    a meta-built role storage (``to_empty``) replaces them."""

    def __init__(self, module: nn.Module, lm: nn.Module, mesh: Any, dp: int):
        self.module, self.lm, self.mesh, self.dp = module, lm, mesh, dp

    @property
    def params(self) -> list[nn.Parameter]:
        return split_params(self.lm)

    def sync_grads(self, replicated: list[nn.Parameter]) -> list[nn.Parameter]:
        """Sum the experts' gradients over ``edp`` and divide them by dp; returns the live
        parameters that stand for ``replicated`` (dp replicas: every trainable parameter
        but the experts; FSDP: none)."""
        import torch.distributed as dist

        split = self.params
        grads = [p.grad._local_tensor for p in split if p.grad is not None]  # type: ignore[union-attr]
        if grads and self.mesh["edp"].size() > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.mesh["edp"].get_group())
            a = 0
            for g in grads:
                g.copy_(flat[a : a + g.numel()].view_as(g))
                a += g.numel()
        if grads:
            torch._foreach_div_(grads, float(self.dp))
        if not replicated:
            return replicated
        ids = {id(p) for p in split}
        return [p for p in self.module.parameters() if p.requires_grad and id(p) not in ids]


def split_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``model``'s experts split over ep, in module order."""
    return [
        m._parameters[name]  # type: ignore[misc]
        for m in model.modules()
        if hasattr(m, EP_ATTR)
        for name in getattr(m, EP_ATTR).get("params", ())
    ]


def expert_shards(module: nn.Module, lm: nn.Module, layout: Any) -> ExpertShards | None:
    """Split ``lm``'s experts by ``layout.ep`` (:func:`shard_experts` over :func:`ep_mesh`);
    None at ep = 1. A model without experts, or whose experts ep does not divide, is a
    ConfigError naming the model type (:func:`ep_problems`)."""
    if layout.ep <= 1:
        return None
    from rpeg.errors import ConfigError

    cfg = getattr(lm, "config", None)
    probs = ep_problems(cfg, layout.ep) if cfg is not None else []
    if not probs and not experts_modules(lm):
        mt = getattr(cfg, "model_type", "?")
        probs = [_problem(f"model_type {mt!r} has no fused experts module to split at ep")]
    if probs:
        raise ConfigError(probs, title="the layout does not split the model's experts")
    mesh = ep_mesh(layout)
    shard_experts(lm, mesh)
    return ExpertShards(module, lm, mesh, layout.dp)


def _problem(msg: str):
    from rpeg.errors import Problem

    return Problem("plan.layout.ep", msg)
