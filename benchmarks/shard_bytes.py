"""Parameter bytes each rank holds for the default rpeg-tiny actor at each layout.

    python benchmarks/shard_bytes.py

Spawns 2 or 4 CPU processes per layout (gloo) and prints (rank, local bytes, share of the
full parameter bytes); the numbers are in docs/parallelism.md ("Shards").
"""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYOUTS = [
    {"dp": 2, "fsdp": True},
    {"tp": 2},
    {"dp": 2, "tp": 2, "fsdp": True},
    {"dp": 2, "tp": 2},
]


def run(rank, ws, lay, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    from rpeg.runtime import sharding as S
    from rpeg.runtime.model_io import create_tiny

    m, _ = create_tiny(seed=0)
    layout = S.Layout(**lay)
    mesh = S.build_mesh(layout)
    full = S.param_bytes_full(m)
    S.shard_roles(m, m, layout, mesh)
    q.put((rank, S.param_bytes_local(m), full))
    dist.destroy_process_group()


def main() -> None:
    ctx = mp.get_context("spawn")
    for i, lay in enumerate(LAYOUTS):
        ws = lay.get("dp", 1) * lay.get("tp", 1)
        q = ctx.Queue()
        ps = [ctx.Process(target=run, args=(r, ws, lay, 29700 + i, q)) for r in range(ws)]
        for p in ps:
            p.start()
        res = sorted(q.get() for _ in ps)
        for p in ps:
            p.join()
        full = res[0][2]
        print(lay, "full", full, [(r, loc, round(loc / full, 4)) for r, loc, _ in res])


if __name__ == "__main__":
    main()
