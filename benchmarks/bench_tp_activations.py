"""Activation values a decoder layer keeps for backward on one rank of RPEG's own tensor
parallelism (rpeg.runtime.tensor_parallel: column/row-wise linears, plain activations, no
sequence parallelism), per token, in units of the hidden size and the MLP width.

For each shape and tp in (1, 2): two gloo ranks (tp=2) or one process (tp=1) build a tiny
Llama-style model of 1 and of 2 layers, split it, run one forward under
``torch.autograd.graph.saved_tensors_hooks`` and count the bytes of the saved tensors that are
not parameters; the 2-layer less the 1-layer count is one layer's. A least-squares fit over
the shapes gives ``a x hidden + b x MLP`` values per token and layer; at tp=1 it is the
10 x hidden + 4 x MLP of rpeg.perf.rank_memory. The tp=2 fit splits that into the part kept
whole on every rank (layer-norm inputs and outputs) and the part split over tp.
``python benchmarks/bench_tp_activations.py`` (~1 min on 2 cores); prints each shape and a
SUMMARY line.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.multiprocessing as mp

SHAPES = [  # hidden, MLP width, heads, kv heads (the kv width varied apart)
    (128, 512, 4, 2),
    (256, 512, 8, 4),
    (256, 1024, 8, 2),
    (384, 768, 8, 4),
    (512, 2048, 8, 4),
    (256, 512, 8, 8),
    (384, 1536, 8, 2),
]
BATCH, TOKENS = 2, 24


def _saved_bytes(module: torch.nn.Module, ids: torch.Tensor) -> int:
    # parameters (a DTensor's: its local shard) are weights, not activations
    params = {
        getattr(p, "_local_tensor", p).untyped_storage().data_ptr() for p in module.parameters()
    }
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            kept[s.data_ptr()] = s.nbytes()
        return t

    module.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(input_ids=ids)
    return sum(kept.values())


def _layer_values(shape: tuple[int, int, int, int], tp_mesh) -> float:
    """Values (fp32) one layer keeps per token on this rank."""
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.tensor_parallel import apply_tensor_parallel

    hidden, ffn, heads, kv = shape
    ids = torch.randint(3, 90, (BATCH, TOKENS), generator=torch.Generator().manual_seed(0))
    kept = []
    for layers in (1, 2):
        m, _ = create_tiny(
            seed=0,
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
        )
        if tp_mesh is not None:
            apply_tensor_parallel(m, tp_mesh)
        kept.append(_saved_bytes(m, ids))
    return (kept[1] - kept[0]) / 4.0 / (BATCH * TOKENS)


def _rank(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    vals = [_layer_values(s, mesh) for s in SHAPES]
    if rank == 0:
        out.put(vals)
    dist.destroy_process_group()


def _fit(vals: list[float]) -> tuple[float, float, float]:
    """Least squares ``a x hidden + b x MLP + c x (kv heads x head dim)`` values."""
    a = torch.tensor([[h, f, kv * h / heads] for h, f, heads, kv in SHAPES], dtype=torch.float64)
    y = torch.tensor(vals, dtype=torch.float64)[:, None]
    coef = torch.linalg.lstsq(a, y).solution[:, 0]
    return float(coef[0]), float(coef[1]), float(coef[2])


def main() -> None:
    one = [_layer_values(s, None) for s in SHAPES]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    two = q.get(timeout=300)
    for p in procs:
        p.join()
    for shape, v1, v2 in zip(SHAPES, one, two, strict=True):
        h, f, heads, kv = shape
        print(
            f"hidden {h:4d} mlp {f:5d} heads {heads:2d} kv {kv:2d}: tp1 {v1:8.1f}  tp2 {v2:8.1f} "
            "values/token/layer"
        )
    h1, f1, k1 = _fit(one)
    h2, f2, k2 = _fit(two)
    # tp=2 keeps r x hidden whole and splits the rest: h2 = r + (h1 - r) / 2
    whole = 2 * h2 - h1
    print(
        f"SUMMARY tp1 {h1:.2f} x hidden + {f1:.2f} x mlp + {k1:.2f} x kv; tp2 {h2:.2f} x hidden "
        f"+ {f2:.2f} x mlp + {k2:.2f} x kv; kept whole on every tp rank {whole:.2f} x hidden"
    )


if __name__ == "__main__":
    sys.exit(main())
