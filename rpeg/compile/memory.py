"""Each rank's predicted peak memory for a compiled step (pure): the performance model's
per-rank accounting (:func:`rpeg.perf.rank_memory.rank_memory`) applied to the groups the
runtime will build, and the memory a worker has (``cluster.worker_memory``, or the GPU's).

Used by ``rpeg predict`` (printed per rank), the preflight (a rank over its worker's memory is
refused before start, naming it), and the run summary (predicted beside measured)."""

from __future__ import annotations

from typing import Any

from rpeg.errors import Problem
from rpeg.perf.rank_memory import RankMemory, parse_size_gb, rank_memory


def rank_peaks(step: Any, config: Any, model: Any = None) -> list[RankMemory]:
    """The predicted peak of a rank of each actor group of the compiled ``step`` for the run
    ``config`` (``model``: the policy's ModelSpec; None: the config's, rpeg.compile.layouts)."""
    from rpeg.compile.layouts import policy_model
    from rpeg.perf import Workload

    model = policy_model(config, model)
    if model is None:
        return []
    wl = Workload.from_config(config.workload, config.model.lora, config.task.multiturn)
    mbs: dict[str, int] = {}
    for t in step.tasks:
        if any(str(k).startswith("train_") for k in t.kinds):
            mbs.setdefault(t.group, int(t.micro_batch_size))
    return rank_memory(
        step.actor_groups, model, wl, train_micro_batch=mbs, staleness=int(step.staleness)
    )


def worker_memory_gb(config: Any, machine_gb: float | None = None) -> float | None:
    """The memory one rank may use: ``cluster.worker_memory`` when it is a size; ``auto``:
    ``machine_gb`` (the machine's, the caller's reading) split over the local workers, as
    Dask's LocalCluster splits it; None when unknown or unlimited (``0``)."""
    c = config.cluster
    size = parse_size_gb(c.worker_memory)
    if size is not None:
        return size
    if str(c.worker_memory).strip() == "0" or machine_gb is None or c.address:
        return None
    return machine_gb / max(1, int(c.n_workers or 1))


def memory_problems(peaks: list[RankMemory], limit_gb: float | None, where: str) -> list[Problem]:
    """A problem for every group whose ranks' predicted peak passes ``limit_gb`` (``where``:
    what the limit is, for the message)."""
    if limit_gb is None:
        return []
    out = []
    for p in peaks:
        if p.peak_gb > limit_gb:
            top = sorted(p.parts.items(), key=lambda kv: -kv[1])[:4]
            parts = ", ".join(f"{k} {v:.2f}" for k, v in top)
            out.append(
                Problem(
                    f"actor group {p.group}",
                    f"each of its {p.ranks} rank(s) needs {p.peak_gb:.2f} GB at its peak "
                    f"({p.phase}: {parts} GB) but {where} is {limit_gb:.2f} GB: shard the "
                    "model over more ranks (engine: fsdp, a larger dp or tp), set "
                    "recompute: true, or give each worker more memory",
                )
            )
    return out
