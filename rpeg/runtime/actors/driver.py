"""The driver: actor groups on a Dask cluster, the staleness buffer, weight sync, checkpoints
and the measured timeline. Prefect tasks (``rpeg.tasks``) are thin calls into this object;
the flow (``rpeg.flows.train``) owns the step loop.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from rpeg.compile import CompiledStep
from rpeg.config import RunConfig
from rpeg.runtime.actors.checkpoint import CheckpointStore
from rpeg.runtime.actors.recorder import TimelineRecorder
from rpeg.runtime.actors.staleness import Sample, StalenessQueue

log = logging.getLogger(__name__)


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def shard(items: Sequence[Any], n: int) -> list[list[Any]]:
    """Contiguous, near-equal shards (groups of samples stay together)."""
    k, r = divmod(len(items), n)
    out, i = [], 0
    for j in range(n):
        m = k + (1 if j < r else 0)
        out.append(list(items[i : i + m]))
        i += m
    return out


def shard_groups(size: int, n: int, group_size: int) -> list[list[int]]:
    """Sample indices of ``n`` shards made of whole groups of ``group_size`` contiguous
    samples (GRPO/RLOO groups are never split across ranks)."""
    if group_size <= 1 or size % group_size:
        return shard(list(range(size)), n)
    return [
        [g * group_size + j for g in gs for j in range(group_size)]
        for gs in shard(list(range(size // group_size)), n)
    ]


class DistributedRun:
    """Actor groups of a :class:`CompiledStep` on the cluster, and the state of the run."""

    def __init__(self, config: RunConfig, compiled: CompiledStep, cluster: Any):
        from rpeg.runtime.data import build_task_data

        self.config = config
        self.compiled = compiled
        self.cluster = cluster
        self.client = cluster.client
        self.k = compiled.staleness
        self.async_rollout = compiled.rollout_group != compiled.trainer_group
        self.cursor, _ = build_task_data(config.task)
        self.queue = StalenessQueue(self.k, config.workload.samples_per_step)
        self.payloads: dict[int, Any] = {}  # step -> list of rank batches (async rollouts)
        self.slot_examples: dict[int, list[Any]] = {}
        self.timeline = TimelineRecorder()
        self.metrics: dict[int, dict[str, float]] = {}
        self.step = 0  # next step to train
        self._lock = threading.Lock()
        self.groups: dict[str, list[Any]] = {}
        self.store = (
            CheckpointStore(config.runtime.checkpoint_url, config.runtime.keep_last)
            if config.runtime.checkpoint_url
            else None
        )
        self.sync_log: list[dict[str, float]] = []

    # ---------------------------------------------------------------- actors
    def start_actors(self, workers: Sequence[str] | None = None) -> None:
        """One actor per rank on the worker of its device; then the process groups.

        ``workers``: live worker addresses, sorted by name (default: the scheduler's list)."""
        cy = self.config.to_yaml()
        workers = list(workers) if workers else self.cluster.workers
        if not hasattr(self, "n_workers"):
            self.n_workers = len(workers)
        from rpeg.runtime.actors.rank import RankActor

        t0 = time.perf_counter()
        self.actor_workers: dict[tuple[str, int], str] = {}
        with self.client.as_current():
            futs = {}
            for g in self.compiled.actor_groups:
                gd = g.to_dict()
                for rank, dev in enumerate(g.devices):
                    addr = workers[dev % len(workers)]
                    self.actor_workers[(g.name, rank)] = addr
                    futs[(g.name, rank)] = self.client.submit(
                        RankActor,
                        cy,
                        gd,
                        rank,
                        self.async_rollout,
                        actor=True,
                        workers=[addr],
                        allow_other_workers=False,
                        pure=False,
                    )
            self.groups = {
                g.name: [futs[(g.name, r)].result() for r in range(g.world_size)]
                for g in self.compiled.actor_groups
            }
            for g in self.compiled.actor_groups:
                actors = self.groups[g.name]
                if g.world_size > 1:
                    url = actors[0].rendezvous().result()
                    pending = [
                        a.init_process_group(url) for a in actors
                    ]  # all ranks before waiting
                    for p in pending:
                        p.result()
        self.actor_start_s = time.perf_counter() - t0

    def call(
        self, group: str, method: str, *args: Any, per_rank: Sequence[Sequence[Any]] | None = None
    ) -> list[Any]:
        """Call ``method`` on every rank of ``group`` (issued to all before waiting)."""
        with self.client.as_current():
            futs = []
            for r, a in enumerate(self.groups[group]):
                extra = per_rank[r] if per_rank is not None else ()
                futs.append(getattr(a, method)(*args, *extra))
            return [f.result() for f in futs]

    def close(self, timeout_s: float = 30.0) -> None:
        """Tear down every actor's process group (each rank on its own: a dead rank does not
        keep the live ones from closing) and drop the handles."""
        import contextlib

        with self.client.as_current():
            pending = []
            for actors in self.groups.values():
                for a in actors:
                    with contextlib.suppress(Exception):
                        pending.append(a.close())
            for p in pending:
                with contextlib.suppress(Exception):
                    p.result(timeout=timeout_s)
        self.groups = {}

    def recover(self, timeout_s: float = 90.0) -> int:
        """After a lost worker: close the buffer and the surviving actors, wait until the
        scheduler has dropped the dead worker and the replacement (nanny restart) answers,
        re-create every actor on the live workers, load the newest complete checkpoint and
        sync the generators. Returns the step to continue from."""
        import contextlib

        self.queue.close()
        # a surviving data-parallel rank may sit in a collective with the dead peer (its one
        # actor thread blocked until the gloo timeout): restart those processes (nanny) too
        dp = {
            a
            for (g, _r), a in getattr(self, "actor_workers", {}).items()
            if self.compiled.group(g).world_size > 1
        }
        live_now = set(self.cluster.workers)
        if dp & live_now:
            with contextlib.suppress(Exception):
                self.client.restart_workers(sorted(dp & live_now), timeout=60)
        else:
            self.close(timeout_s=10.0)
        self.groups = {}
        need = max(self.compiled.num_devices, 1)
        expect = max(getattr(self, "n_workers", need), need)
        live = self.cluster.live_workers(expect, timeout_s=timeout_s, min_ok=need)
        with self._lock:
            self.payloads.clear()
            self.slot_examples.clear()
        self.start_actors(live)
        got = self.restore()
        if got is None:
            raise RuntimeError(
                "a worker was lost and there is no complete checkpoint to recover from"
            )
        self.sync_at_start()
        return got

    # ---------------------------------------------------------------- data movement
    def put_sharded(self, step: int, dst: str, batches: list[Any]) -> None:
        from rpeg.runtime.batch import RolloutBatch

        n = len(self.groups[dst])
        if len(batches) == n:
            parts = batches
        else:
            whole = RolloutBatch.concat(batches) if len(batches) > 1 else batches[0]
            idx = shard_groups(whole.size, n, self.config.workload.samples_per_prompt)
            parts = [whole.select(torch.tensor(i, dtype=torch.long)) for i in idx]
        self.call(dst, "put_batch", step, per_rank=[(p,) for p in parts])

    def _merge_inputs(self, step: int, task: Any) -> None:
        """Before a unit runs: bring its dependencies' fields into its group."""
        srcs = []
        for d in task.depends_on:
            dt = self.compiled.task(d)
            if self.async_rollout and dt.phase == "rollout" and task.phase == "train":
                continue  # arrived through the staleness buffer (take)
            g = dt.group
            if g not in srcs:
                srcs.append(g)
        if not srcs or srcs == [task.group]:
            return
        base_src = task.group if task.group in srcs else srcs[0]
        shards = self.call(base_src, "get_batch", step)
        from rpeg.runtime.batch import RolloutBatch

        whole = RolloutBatch.concat(shards) if len(shards) > 1 else shards[0]
        for g in srcs:
            if g == base_src:
                continue
            other = self.call(g, "get_batch", step)
            o = RolloutBatch.concat(other) if len(other) > 1 else other[0]
            fields = {
                f: getattr(o, f)
                for f in (
                    "old_logprobs",
                    "ref_logprobs",
                    "values",
                    "rewards",
                    "correct",
                    "advantages",
                    "returns",
                )
                if getattr(o, f) is not None and getattr(whole, f) is None
            }
            whole = whole.replace(**fields)
        self.put_sharded(step, task.group, [whole])

    # ---------------------------------------------------------------- units
    def examples_for(self, step: int) -> list[Any]:
        with self._lock:
            if step not in self.slot_examples:
                self.slot_examples[step] = self.cursor.next(self.config.workload.num_prompts)
            return self.slot_examples[step]

    def run_unit(self, step: int, task_name: str) -> dict[str, float]:
        """Run one execution unit of ``step`` on its actor group; record its span."""
        task = self.compiled.task(task_name)
        g = self.compiled.group(task.group)
        t0 = time.perf_counter()
        self.timeline.start_step(step)
        per_rank = None
        if "generate" in task.kinds:
            ex = self.examples_for(step)
            per_rank = [(s,) for s in shard(ex, g.world_size)]
        else:
            self._merge_inputs(step, task)
        if per_rank is None:
            per_rank = [(None,)] * g.world_size
        res = self.call(task.group, "run_unit", step, task.stages, task.kinds, per_rank=per_rank)
        t1 = time.perf_counter()
        for r, m in enumerate(res):
            spans, pid = m.pop("_spans", []), m.pop("_pid", -1)
            self.timeline.add_stage_spans(step, task.name, r, pid, spans)
        from rpeg.plan import format_devices

        self.timeline.add(
            step, task.name, format_devices(tuple(g.devices)), t0, t1, kind="+".join(task.kinds)
        )
        return _reduce_metrics(res)

    # ---------------------------------------------------------------- async rollout
    def rollout(self, timeout_s: float = 600.0) -> int:
        """Generate the next admitted slot on the rollout group, put it in the buffer."""
        B = self.config.workload.samples_per_step
        adm = self.queue.acquire(lambda: self.queue.state.generator_version, B, timeout_s)
        step = adm.start // B
        self.timeline.start_step(step)
        m: dict[str, float] = {}
        for t in self.compiled.tasks_in("rollout"):
            m.update(self.run_unit(step, t.name))
        batches = self.call(self.compiled.rollout_group, "get_batch", step, True)
        with self._lock:
            self.payloads[step] = batches
            self.metrics.setdefault(step, {}).update(m)
        self.queue.put(
            [Sample(i, adm.version, payload=step) for i in range(adm.start, adm.start + adm.count)]
        )
        return step

    def take(self, step: int, timeout_s: float = 600.0) -> dict[str, float]:
        """Train side: the step's batch from the buffer into the trainer group."""
        d = self.queue.get(step, timeout_s)
        with self._lock:
            batches = self.payloads.pop(step)
        self.put_sharded(step, self.compiled.trainer_group, batches)
        return {"staleness_max": float(d.max_lag), "buffer_wait_s": 0.0}

    def sync_weights(self, step: int) -> dict[str, float]:
        """Bucketed weight sync trainer rank 0 -> every rank of the generator groups."""
        ws = self.compiled.weight_sync
        if ws["mode"] == "shared" or not ws["targets"]:
            return {}
        t0 = time.perf_counter()
        with self.client.as_current():
            buckets, version = (
                self.groups[ws["source"]][0].get_weight_buckets(ws["bucket_bytes"]).result()
            )
        from rpeg.runtime.actors.weight_sync import total_bytes

        for g in ws["targets"]:
            self.call(g, "load_weight_buckets", buckets, version)
        self.queue.synced(version)
        dt = time.perf_counter() - t0
        nbytes = total_bytes(buckets)
        self.sync_log.append({"step": step, "weight_sync_s": dt, "weight_sync_bytes": nbytes})
        return {
            "weight_sync_s": dt,
            "weight_sync_bytes": float(nbytes),
            "weight_sync_buckets": float(len(buckets)),
        }

    def publish(self, version: int) -> None:
        """Trainer finished an update (async bookkeeping; the sync path keeps it in step)."""
        self.queue.publish(version)

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self, step_done: int) -> dict[str, float]:
        """Save after ``step_done`` steps: trainable ranks, cursor, buffer with payloads."""
        if self.store is None:
            return {}
        t0 = time.perf_counter()
        parts: dict[str, bytes] = {}
        for g in self.compiled.actor_groups:
            if not g.trainable:
                continue
            for r, data in enumerate(self.call(g.name, "state_bytes")):
                parts[f"{g.name}-rank{r}.pt"] = data
        with self._lock:
            driver = {
                "step": step_done,
                "cursor": self.cursor.state_dict(),
                "buffer": self.queue.state_dict(),
                "payloads": dict(self.payloads),
                "slot_examples": {s: e for s, e in self.slot_examples.items() if s >= step_done},
                "metrics": {s: m for s, m in self.metrics.items() if s < step_done},
            }
        parts["driver.pt"] = _dumps(driver)
        version = step_done
        info = self.store.save(step_done, parts, {"policy_version": version, "staleness": self.k})
        return {
            "checkpoint_s": time.perf_counter() - t0,
            "checkpoint_bytes": float(info.meta["total_bytes"]),
        }

    def restore(self) -> int | None:
        """Load the newest complete checkpoint into the actors; return its step (or None)."""
        if self.store is None:
            return None
        got = self.store.latest()
        if got is None:
            return None
        meta, parts = got
        for g in self.compiled.actor_groups:
            if not g.trainable:
                continue
            self.call(
                g.name,
                "load_state_bytes",
                per_rank=[(parts[f"{g.name}-rank{r}.pt"],) for r in range(g.world_size)],
            )
        d = _loads(parts["driver.pt"])
        self.cursor.load_state_dict(d["cursor"])
        self.queue = StalenessQueue.from_state_dict(d["buffer"], k=self.k)
        self.payloads = dict(d["payloads"])
        self.slot_examples = dict(d["slot_examples"])
        self.metrics = dict(d["metrics"])
        self.step = int(d["step"])
        return self.step

    def sync_at_start(self) -> None:
        """Generators get the trainer's weights first (avoids the staleness livelock)."""
        if self.async_rollout:
            self.sync_weights(self.step)
        else:
            self.queue.state.generator_version = self.queue.state.trainer_version


def _reduce_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    if len(per_rank) == 1:
        return dict(per_rank[0])
    keys = set().union(*per_rank)
    out = {}
    for k in keys:
        vals = [m[k] for m in per_rank if k in m]
        if k.endswith("_s"):
            out[k] = max(vals)
        elif k in ("num_tokens",):
            out[k] = sum(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out
