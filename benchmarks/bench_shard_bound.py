"""How fast can a sharded layout's training stage be on this machine? Three ways to run the
same ``train_step`` on the same rollout, side by side:

* ``local``  -- one process, the whole batch (what ``rpeg train --local`` does);
* ``bound``  -- N independent processes at once, each with 1/N of the rows and no
  communication at all: the lower bound of any N-rank layout that runs the model's ops on
  every rank (tensor and data parallelism both do), whatever its collectives cost;
* ``layout`` -- the config's compiled training layout (dp x tp, FSDP2) on N spawned ranks
  (gloo and the pair channel, as the runtime's ranks run it, without Prefect or Dask).

    python benchmarks/bench_shard_bound.py [--config configs/sharded-cpu.yaml] [--steps 6]
        [--rounds 2]

The batch is the config's real rollout: one step of the single-process trainer (the task's
prompts, the warmed-up model's responses, their advantages), handed to every process as a
file of tensors (loaded with ``weights_only``). Processes are bound to cores as the runtime
binds its workers (``rpeg.runtime.cpu_binding``, ``auto``). Medians over every step but each
run's first; CPU seconds are each process's own (``time.process_time``). When N processes
share fewer than N cores, ``bound`` / ``local`` above 1 says that no layout of N ranks can
match one process here (docs/ranks.md "More ranks than cores";
figures in docs/measurements.md).

Prints one line per mode and ``SUMMARY cores=C ranks=N local=.. bound=.. (x) layout=.. (x)``.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import sys
import tempfile
import time

os.environ.setdefault("DO_NOT_TRACK", "1")

#: tensor fields of a RolloutBatch carried to the children (the rest are text or scalars)
_FIELDS = (
    "prompt_ids",
    "prompt_mask",
    "response_ids",
    "response_mask",
    "sample_logprobs",
    "policy_version",
    "group_ids",
    "rewards",
    "correct",
    "old_logprobs",
    "ref_logprobs",
    "advantages",
    "sample_index",
)


def _config(path: str, out: str):
    from rpeg.config import RunConfig

    return RunConfig.from_yaml(path).with_overrides({"runtime.output_dir": out})


def _rollout(cfg, where: str) -> None:
    """One step of the single-process trainer; its batch's tensors saved to ``where``."""
    import torch

    from rpeg.runtime.local_trainer import LocalTrainer

    t = LocalTrainer(cfg)
    t.step()
    b = t.last_batch
    torch.save({k: getattr(b, k) for k in _FIELDS if getattr(b, k) is not None}, where)


def _load_batch(where: str):
    import torch

    from rpeg.runtime.batch import RolloutBatch

    return RolloutBatch(**torch.load(where, weights_only=True))


def _child(i: int, n: int, mode: str, args: tuple, q) -> None:
    """Process ``i`` of ``n`` in ``mode``: build the actor, time ``steps`` train steps."""
    cfg_path, out, batch_path, steps, layout, local_threads, port = args
    from rpeg.runtime.cpu_binding import HOST_CORES, bind_process, core_block, should_bind

    if should_bind("auto", n, len(HOST_CORES)):
        bind_process(core_block(HOST_CORES, i, n))
    import torch

    from rpeg.runtime.role_builder import build_roles

    cfg = _config(cfg_path, out)
    if mode == "local" and local_threads:
        cfg = cfg.with_overrides({"runtime.torch_threads": local_threads})
    actor = build_roles(cfg, ["actor"], engine="torch").actor
    batch = _load_batch(batch_path)
    rows = list(range(batch.size))
    if mode == "layout":
        import torch.distributed as dist

        from rpeg.runtime.mesh import Layout, build_mesh
        from rpeg.runtime.parallel import LOCAL, process_group_reduce

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=n)
        lay = Layout(**layout)
        mesh = build_mesh(lay)
        reduce = process_group_reduce(mesh.get_group("dp")) if lay.dp > 1 else LOCAL
        actor.apply_layout(lay, mesh, reduce)
        d, per = lay.dp_index(i), batch.size // lay.dp
        rows = rows[d * per : (d + 1) * per]
    elif mode == "bound":
        per = batch.size // n
        rows = rows[i * per : (i + 1) * per]
    mine = batch.select(rows)
    walls, cpus = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        actor.train_step(mine)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    q.put((i, statistics.median(walls[1:]), statistics.median(cpus[1:])))
    if mode == "layout":
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(mode: str, n: int, args: tuple) -> tuple[float, float]:
    """(wall, CPU per process) of ``mode`` over ``n`` processes: the slowest wall, the mean CPU."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    args = (*args[:-1], _free_port())
    procs = [ctx.Process(target=_child, args=(i, n, mode, args, q)) for i in range(n)]
    for p in procs:
        p.start()
    got = []
    while len(got) < len(procs):
        try:
            got.append(q.get(timeout=5))
        except queue.Empty:
            if any(p.exitcode for p in procs):  # a rank died: the others wait on it forever
                for p in procs:
                    p.kill()
                raise RuntimeError(f"{mode}: a process failed (its traceback is above)") from None
    for p in procs:
        p.join()
    return max(g[1] for g in got), statistics.fmean(g[2] for g in got)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/sharded-cpu.yaml")
    ap.add_argument("--steps", type=int, default=6, help="train steps per run (first left out)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, interleaved")
    ap.add_argument(
        "--local-threads",
        type=int,
        default=0,
        help="torch threads of the one-process mode (0: the config's runtime.torch_threads)",
    )
    a = ap.parse_args(argv)
    if a.steps < 2:
        ap.error("--steps must be at least 2 (each run's first step is left out)")
    from rpeg.compile import compile_plan
    from rpeg.runtime.cpu_binding import HOST_CORES

    out = tempfile.mkdtemp(prefix="rpeg-bound-")
    cfg = _config(a.config, out)
    step = compile_plan(None, cfg)
    group = step.group(step.trainer_group)
    layout = {
        "dp": group.dp,
        "tp": group.tp,
        "fsdp": group.fsdp,
        "reshard_after_forward": group.reshard_after_forward,
    }
    n = group.world_size
    batch_path = os.path.join(out, "batch.pt")
    _rollout(cfg, batch_path)
    args = (a.config, out, batch_path, a.steps, layout, a.local_threads, 0)
    res: dict[str, list[tuple[float, float]]] = {"local": [], "bound": [], "layout": []}
    for r in range(a.rounds):
        for mode in ("local", "bound", "layout") if r % 2 == 0 else ("layout", "bound", "local"):
            res[mode].append(_run(mode, 1 if mode == "local" else n, args))
    med = {m: statistics.median(w for w, _ in v) for m, v in res.items()}
    cpu = {m: statistics.median(c for _, c in v) for m, v in res.items()}
    cores = len(HOST_CORES)
    print(f"layout of {a.config}'s trainer: {layout}, {n} ranks on {cores} cores")
    for m in res:
        print(
            f"{m:7s} {med[m]:.3f} s per train step (wall), {cpu[m]:.3f} CPU-s per process, "
            f"{med[m] / med['local']:.2f}x local"
        )
    print(
        f"SUMMARY cores={cores} ranks={n} local={med['local']:.3f} "
        f"bound={med['bound']:.3f} ({med['bound'] / med['local']:.2f}x) "
        f"layout={med['layout']:.3f} ({med['layout'] / med['local']:.2f}x)"
    )
    return {"wall": med, "cpu": cpu, "cores": cores, "ranks": n}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
