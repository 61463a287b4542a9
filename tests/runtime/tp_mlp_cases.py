"""What the tensor-parallel tests run on each rank: a column-wise -> row-wise MLP and a gated
decoder MLP split over the tp group, with their single-process twins (spawned by
:func:`sharding_cases.spawn`, kind ``tensor_parallel``)."""

from __future__ import annotations

import torch


def mlp_reference(seed: int = 0):
    """A column-wise -> row-wise pair's dense twin: (module, input) on one process."""
    g = torch.Generator().manual_seed(seed)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(8, 12, bias=True), torch.nn.GELU(), torch.nn.Linear(12, 8, bias=True)
    )
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return mlp, torch.randn(5, 8, generator=g)


class GatedMLP(torch.nn.Module):
    """norm -> gate, up (both read the norm's output) -> down: a decoder block's MLP."""

    def __init__(self, seed: int = 1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = torch.nn.LayerNorm(8)
        self.gate = torch.nn.Linear(8, 12, bias=False)
        self.up = torch.nn.Linear(8, 12, bias=False)
        self.down = torch.nn.Linear(12, 8, bias=False)
        with torch.no_grad():
            for p in (self.gate.weight, self.up.weight, self.down.weight):
                p.copy_(torch.randn(p.shape, generator=g) / 3)

    def forward(self, x):
        h = self.norm(x)
        return self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def gated_input(seed: int = 2):
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(seed))


def tensor_parallel_case(mesh, rank: int) -> dict:
    """tp_all_reduce on each rank's own tensor; the MLP split column-wise then row-wise:
    output, input gradient, full parameter gradients and the parameters' placements."""
    from rpeg.runtime.tensor_parallel import shard_linear, tp_all_reduce

    tp = mesh["tp"]
    mine = torch.randn(3, 7, generator=torch.Generator().manual_seed(100 + rank))
    summed = tp_all_reduce(mine.clone(), tp.get_group())
    mlp, x = mlp_reference()
    shard_linear(mlp[0], "colwise", tp)
    shard_linear(mlp[2], "rowwise", tp)
    x = x.clone().requires_grad_(True)
    y = mlp(x)
    (y * torch.arange(8.0)).sum().backward()
    from rpeg.runtime.tensor_parallel import copy_once_after

    gm = GatedMLP()
    shard_linear(gm.gate, "colwise", tp)
    shard_linear(gm.up, "colwise", tp)
    shard_linear(gm.down, "rowwise", tp)
    copy_once_after(gm.norm, [gm.gate, gm.up])
    gx = gated_input().requires_grad_(True)
    (gm(gx) * torch.arange(8.0)).sum().backward()
    from rpeg.runtime.parallel import process_group_reduce

    world = process_group_reduce()  # the default group: the pair exchange path
    return {
        "reduce_sum": world.sum(torch.tensor([rank + 1.0, 0.5])),
        "reduce_max": world.max(torch.tensor([5 * rank, 7 - rank])),
        "gated_x_grad": gx.grad,
        "gated_grads": {
            n: p.grad.full_tensor() for n, p in gm.named_parameters() if "norm" not in n
        },
        "mine": mine,
        "summed": summed,
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": {n: p.grad.full_tensor() for n, p in mlp.named_parameters()},
        "placements": {n: str(p.placements) for n, p in mlp.named_parameters()},
        "local_shapes": {n: list(p.to_local().shape) for n, p in mlp.named_parameters()},
    }
