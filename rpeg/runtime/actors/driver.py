"""The driver: the data of a run on its actor groups (which ranks hold which step's rows,
in-flight rollouts, prompts drawn per step), weight sync, checkpoints and the measured
timeline. Prefect tasks (``rpeg.tasks``) are thin calls into this object; it decides nothing
about the order of work: the step scheduler (:mod:`rpeg.runtime.actors.scheduler`) does, and
the flow (``rpeg.flows.train``) executes its instructions.

Cohesive pieces it is made of: :class:`rpeg.runtime.actors.lifecycle.ActorSet` (start,
close, abandon and re-create the actors; typed proxies per group), the checkpoint store
(:mod:`rpeg.runtime.actors.checkpoint`) and the :class:`TimelineRecorder`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from rpeg.compile import CompiledStep
from rpeg.config import RunConfig
from rpeg.runtime.actors.checkpoint import CheckpointStore
from rpeg.runtime.actors.checkpoint import dumps as checkpoint_dumps
from rpeg.runtime.actors.checkpoint import loads as checkpoint_loads
from rpeg.runtime.actors.lifecycle import ActorSet
from rpeg.runtime.actors.proxies import broadcast_weights, join_sync_group
from rpeg.runtime.actors.recorder import TimelineRecorder
from rpeg.runtime.actors.row_shards import prompt_shards, shard_groups
from rpeg.runtime.actors.unit_call import UnitCall
from rpeg.runtime.actors.unit_chains import arrives_by_take, step_chains, unit_layout
from rpeg.runtime.actors.unit_result import reduce_results

log = logging.getLogger(__name__)


#: fields a unit takes from a dependency on another group (the rows it holds lack them)
MERGED_FIELDS = (
    "old_logprobs",
    "ref_logprobs",
    "values",
    "rewards",
    "correct",
    "advantages",
    "returns",
)


#: unit kinds that can consume a streaming rollout chunk by chunk (forward passes only)
STREAM_CONSUMER_KINDS = frozenset({"ref_logprob", "old_logprob", "values"})

#: a sharded group's shards in a checkpoint's folder: ``<step folder>/<group>.dcp``
SHARDS_SUFFIX = ".dcp"


def _writes_shards(g: Any) -> bool:
    """A trainable group sharded by FSDP or TP: its ranks write their own shards of the
    weights and optimizer state at a checkpoint (no rank holds the whole of either)."""
    return bool(g.trainable) and (g.tp > 1 or (g.fsdp and g.dp > 1))


class DistributedRun:
    """Actor groups of a :class:`CompiledStep` on the cluster, and the state of the run."""

    def __init__(self, config: RunConfig, compiled: CompiledStep, cluster: Any):
        from rpeg.runtime.data import build_task_data

        self.config = config
        self.compiled = compiled
        self.cluster = cluster
        self.client = cluster.client
        from rpeg.compile.checks import check_step

        check_step(compiled)  # a hand-edited compiled step is refused before any actor starts
        self.k = compiled.staleness
        self.async_rollout = compiled.async_rollout
        from rpeg.runtime.datasets.fit import task_tokenizer

        # the prompts exactly as the ranks' policy gets them (chat template, length policy)
        self.cursor, _ = build_task_data(
            config.task, task_tokenizer(config), config.workload.max_prompt_tokens
        )
        # step -> Holding (metadata: which ranks hold the rows) of async rollouts in flight;
        # the tensors stay on the rollout actors until the trainer pulls them
        self.payloads: dict[int, Any] = {}
        self.holdings: dict[tuple[str, int], Any] = {}  # (group, step) -> Holding
        self.driver_bytes: dict[int, int] = {}  # step -> tensor bytes through this process
        self.batch_bytes: dict[int, int] = {}  # step -> tensor bytes of the step's batch
        self.pulled_bytes: dict[int, int] = {}  # step -> tensor bytes moved actor to actor
        self.slot_examples: dict[int, list[Any]] = {}
        self._streamed: dict[tuple[int, str], dict[str, float]] = {}  # units run on chunks
        # chains of units issued as one call per rank (unit_chains): head -> its units, and
        # the results of the later units of a chain that ran, until the scheduler asks
        self._chains = {c[0]: c for c in step_chains(compiled) if len(c) > 1}
        self._chained: dict[tuple[int, str], dict[str, float]] = {}
        self._tails: dict[tuple[int, str], tuple[str, ...]] = {}  # a streamed head's rest
        self.timeline = TimelineRecorder()
        self._lock = threading.Lock()
        self.actors = ActorSet(
            config, compiled, cluster, self.async_rollout, count_bytes=self._count_driver_bytes
        )
        self._synced_once = False
        self.store = (
            CheckpointStore.for_run(config.runtime) if config.runtime.checkpoint_url else None
        )
        self._initial_cursor = self.cursor.state_dict()  # a recovery before any checkpoint
        self.sync_log: list[dict[str, float]] = []
        self.logged_samples: list[list[Any]] = []  # rpeg.runtime.samples rows, per logged step
        if not (config.runtime.resume or config.runtime.resume_from):  # a new run: a new file
            from pathlib import Path

            from rpeg.runtime.samples import SAMPLES_FILE

            Path(config.runtime.output_dir, SAMPLES_FILE).unlink(missing_ok=True)

    # ---------------------------------------------------------------- actors
    def start_actors(self, workers: Sequence[str] | None = None) -> None:
        """One actor per rank on the worker of its device, the process groups, then the
        weight-sync group. ``workers``: live worker addresses sorted by name."""
        self.actors.start(workers)
        self._synced_once = False
        self._init_weight_sync()

    def restart_actors(self, timeout_s: float = 90.0) -> None:
        """Every actor started again on the live workers (after :meth:`abandon`), then the
        weight-sync group; the generators get the weights at the next sync."""
        self.actors.recreate(timeout_s)
        self._synced_once = False
        self._init_weight_sync()

    @property
    def groups(self) -> dict[str, list[Any]]:
        """Raw actor handles per group (prefer ``self.group(name)``, the typed proxy)."""
        return self.actors.handles()

    def group(self, name: str) -> Any:
        """The typed proxy of group ``name`` (:class:`rpeg.runtime.actors.proxies.RankGroup`)."""
        return self.actors.group(name)

    @property
    def actor_start_s(self) -> float:
        return self.actors.start_s

    def _init_weight_sync(self) -> None:
        """The weight-sync process group: trainer rank 0 (sync rank 0) and every rank of the
        generator groups, joined all before waiting."""
        ws = self.compiled.weight_sync
        if not ws.copies:
            return
        join_sync_group(self.group(ws.source), [self.group(g) for g in ws.targets])

    def _count_driver_bytes(self, step: int, nbytes: int) -> None:
        """Tensor bytes of ``step`` that passed through the flow process (the groups' data
        methods report them: ``driver_bytes_per_step``)."""
        with self._lock:
            self.driver_bytes[step] = self.driver_bytes.get(step, 0) + nbytes

    def close(self, timeout_s: float = 30.0) -> None:
        """Tear down every actor's process group and drop the handles (after keeping what
        each rank holds and its peak memory, for the summary)."""
        self._rank_info()
        self.actors.close(timeout_s)

    def _rank_info(self, timeout_s: float = 10.0) -> dict[str, list[tuple[Any, Any]]]:
        """Per group: (layout_info, memory_info) of every rank, cached at the last call made
        while the actors were up (a rank that does not answer in ``timeout_s`` -- lost, or
        stuck in a collective -- leaves its group out)."""
        import contextlib

        if not self.actors.groups:
            return getattr(self, "_rank_info_cache", {})
        info: dict[str, list[tuple[Any, Any]]] = {}
        for name, group in self.actors.groups.items():
            with contextlib.suppress(Exception):
                info[name] = group.rank_info(timeout_s)
        self._rank_info_cache = info
        return info

    # ---------------------------------------------------------------- recovery
    def abandon(self) -> None:
        """A worker was lost: restart or close the surviving actors (``ActorSet.abandon``)."""
        self.actors.abandon()

    def recover(self, timeout_s: float = 90.0) -> dict[str, Any]:
        """After :meth:`abandon` and once no task runs: forget the data held on the old
        actors, re-create every actor on the live workers and load the newest complete
        checkpoint. Returns its step scheduler state; None when no checkpoint has committed
        yet (the actors are fresh and the data cursor is back at its start: the caller
        restarts the step scheduler from its initial state -- the same run again)."""
        with self._lock:
            self.payloads.clear()
            self.holdings.clear()
            self._streamed.clear()
            self._chained.clear()
            self._tails.clear()
            self.slot_examples.clear()
        self.restart_actors(timeout_s)
        state = self.restore()
        if state is None:  # lost before the first checkpoint committed: start over
            self.cursor.load_state_dict(self._initial_cursor)
            log.warning("no complete checkpoint yet: the run starts again from step 0")
        return state

    # ---------------------------------------------------------------- data movement
    def put_sharded(self, step: int, dst: str, batches: list[Any]) -> None:
        """Driver-held batches into ``dst`` (sharded by its dp, replicated over its tp): the
        restore path of in-flight rollouts only; steps move batches actor to actor."""
        from rpeg.runtime.actors.dataplane import Holding
        from rpeg.runtime.batch import RolloutBatch

        g = self.compiled.group(dst)
        whole = RolloutBatch.concat(batches) if len(batches) > 1 else batches[0]
        idx = shard_groups(whole.size, g.dp, self.config.workload.samples_per_prompt)
        parts = [whole.select(torch.tensor(i, dtype=torch.long)) for i in idx]
        self.group(dst).put_batch(step, [parts[r // g.tp] for r in range(g.world_size)])
        self.holdings[(dst, step)] = Holding(dst, g.dp, g.tp, tuple(p.size for p in parts))

    def _layout(self, task: Any) -> tuple[int, int]:
        """(dp, tp) the ranks of ``task``'s group run it at (generation: gen_tp)."""
        return unit_layout(self.compiled.group(task.group), task)

    def pull(self, step: int, src: Any, dst: str, fields: list[str] | None = None) -> int:
        """``dst``'s ranks fetch their rows of ``src`` (a Holding) from its actors directly;
        ``fields``: only those fields, merged into the rows ``dst`` already holds. Returns the
        tensor bytes moved actor to actor."""
        from rpeg.runtime.actors.dataplane import Holding, plan_pull

        g = self.compiled.group(dst)
        slices, sizes = plan_pull(src, g.dp, g.tp, self.config.workload.samples_per_prompt)
        producers = self.group(src.group).handles  # passed to the consumers, who read them
        stage = src.group == dst  # a group resharding its own rows: commit after all reads
        per_rank = [
            ([(producers[r], a, b) for r, a, b in parts], fields, stage) for parts in slices
        ]
        consumer = self.group(dst)
        got = consumer.pull(step, per_rank)
        if stage:
            consumer.commit(step)
        if fields is None:
            self.holdings[(dst, step)] = Holding(dst, g.dp, g.tp, sizes)
        n = int(sum(got))
        with self._lock:
            self.pulled_bytes[step] = self.pulled_bytes.get(step, 0) + n
        return n

    def _merge_inputs(self, step: int, task: Any) -> None:
        """Before a unit runs: its group's ranks pull the rows (or the missing fields) of its
        dependencies from the groups that hold them -- actor to actor, sharded for the
        unit's layout; the driver only plans the slices."""
        from rpeg.runtime.actors.dataplane import same_rows

        srcs = []
        for d in task.depends_on:
            dt = self.compiled.task(d)
            if arrives_by_take(self.compiled, task, dt):
                continue
            g = dt.group
            if g not in srcs:
                srcs.append(g)
        own = self.holdings.get((task.group, step))
        dp, _tp = self._layout(task)
        gs = self.config.workload.samples_per_prompt
        if own is not None and task.group in srcs and not same_rows(own, dp, gs):
            self.pull(step, own, task.group)  # e.g. generated at gen_tp, trained at tp
        if not srcs or srcs == [task.group]:
            return
        base_src = task.group if task.group in srcs else srcs[0]
        if base_src != task.group:
            self.pull(step, self.holdings[(base_src, step)], task.group)
        for g in srcs:
            if g == base_src:
                continue
            self.pull(step, self.holdings[(g, step)], task.group, fields=list(MERGED_FIELDS))

    # ---------------------------------------------------------------- units
    def examples_for(self, step: int) -> list[Any]:
        with self._lock:
            if step not in self.slot_examples:
                self.slot_examples[step] = self.cursor.next(self.config.workload.num_prompts)
            return self.slot_examples[step]

    def run_unit(self, step: int, task_name: str) -> dict[str, float]:
        """Run one execution unit of ``step`` on its actor group; record its span. The unit
        runs with its compiled micro-batch size and, when it streams, in chunks."""

        task = self.compiled.task(task_name)
        g = self.compiled.group(task.group)
        dp, tp = self._layout(task)
        chain = self._chains.get(task_name)
        done = self._streamed.pop((step, task_name), None)
        if done is not None:  # ran on the rollout's chunks already (streaming across groups)
            if chain is not None and len(chain) > 2:  # the rest of its chain still goes as one
                with self._lock:
                    self._tails[(step, chain[1])] = chain[1:]
            return done
        with self._lock:
            done = self._chained.pop((step, task_name), None)
            chain = self._tails.pop((step, task_name), chain)
        if done is not None:  # ran in its chain's call already
            return done
        t0 = time.perf_counter()
        self.timeline.start_step(step)
        if task.generates:
            shards = prompt_shards(self.examples_for(step), dp)
            per_rank = [UnitCall(task, shards[r // tp]) for r in range(g.world_size)]
        else:
            self._merge_inputs(step, task)
            per_rank = [UnitCall(task)] * g.world_size
        if chain is not None:
            return self._run_chain(step, chain, per_rank, t0)
        return self._finish_unit(step, task, per_rank, t0)

    def _run_chain(
        self, step: int, chain: tuple[str, ...], head: list[UnitCall], t0: float
    ) -> dict[str, float]:
        """The units of ``chain`` in one call per rank (``head``: the first unit's per-rank
        calls; the others need nothing but their unit); records each unit as
        :meth:`_finish_unit` does and keeps the later units' metrics for the scheduler."""
        tasks = [self.compiled.task(n) for n in chain]
        per_rank = [[h] + [UnitCall(t) for t in tasks[1:]] for h in head]
        res = self.group(tasks[0].group).run_units(step, per_rank)
        t1 = time.perf_counter()
        clock = self.timeline.perf_of_wall
        outs = []
        start = t0
        for i, t in enumerate(tasks):
            unit_res = [r[i] for r in res]
            spans = [sp for u in unit_res for sp in u.spans]
            end = t1 if i == len(tasks) - 1 or not spans else clock(max(sp.end for sp in spans))
            outs.append(self._record_unit(step, t, unit_res, start, max(end, start)))
            start = max(end, start)
        with self._lock:
            for t, out in zip(tasks[1:], outs[1:], strict=True):
                self._chained[(step, t.name)] = out
        return outs[0]

    def _finish_unit(
        self, step: int, task: Any, per_rank: list[UnitCall], t0: float | None = None
    ) -> dict[str, float]:
        """Issue the unit on every rank of its group; record the rows it leaves, its spans."""
        t0 = time.perf_counter() if t0 is None else t0
        res = self.group(task.group).run_unit(step, per_rank)
        return self._record_unit(step, task, res, t0, time.perf_counter())

    def _record_unit(
        self, step: int, task: Any, res: list[Any], t0: float, t1: float
    ) -> dict[str, float]:
        """The rows ``task`` left on its group, its spans and timeline record; its metrics."""
        from rpeg.runtime.actors.dataplane import Holding

        g = self.compiled.group(task.group)
        dp, tp = self._layout(task)
        rows = [r.rows for r in res]
        nbytes = [r.batch_bytes for r in res]
        if rows and rows[0] is not None:
            self.holdings[(task.group, step)] = Holding(
                task.group, dp, tp, tuple(rows[i * tp] for i in range(dp))
            )
            with self._lock:  # the step's batch at its largest (every field filled in)
                self.batch_bytes[step] = max(
                    self.batch_bytes.get(step, 0), sum(nbytes[i * tp] for i in range(dp))
                )
        for r, u in enumerate(res):
            spans = [(sp.stage, sp.start, sp.end) for sp in u.spans]
            self.timeline.add_stage_spans(step, task.name, r, u.pid, spans)
        from rpeg.plan import format_devices

        self.timeline.add(
            step, task.name, format_devices(tuple(g.devices)), t0, t1, kind="+".join(task.kinds)
        )
        self._write_samples([s for u in res for s in u.samples])
        out = reduce_results(res)
        out[f"unit_s/{task.name}"] = out.get("unit_s", t1 - t0)
        return out

    def _write_samples(self, got: list[Any]) -> None:
        """A logged step's rows from its advantage unit -> samples.jsonl (+ a few printed)."""
        if not got:
            return
        from rpeg.runtime import samples as SM

        rows = SM.merge(got)
        with self._lock:
            SM.append_samples(self.config.runtime.output_dir, rows)
            self.logged_samples.append(rows)
        for line in SM.sample_lines(rows):
            print(line, flush=True)

    def release(self, step: int) -> None:
        """Drop the step's rows on every group that holds them, and its prompts."""
        held = [g for (g, s) in list(self.holdings) if s == step]
        for g in held:
            self.group(g).drop(step)
            self.holdings.pop((g, step), None)
        with self._lock:
            self.slot_examples.pop(step, None)
            for kept in (self._chained, self._tails):
                for key in [k for k in kept if k[0] == step]:
                    del kept[key]

    def data_plane_metrics(self, step: int) -> dict[str, float]:
        """Bytes of the step: through the flow process, of the batch, actor to actor."""
        with self._lock:
            return {
                "driver_bytes": float(self.driver_bytes.get(step, 0)),
                "batch_bytes": float(self.batch_bytes.get(step, 0)),
                "actor_to_actor_bytes": float(self.pulled_bytes.get(step, 0)),
            }

    def summary_extras(self, hist: list[dict[str, float]]) -> dict[str, Any]:
        """Run-summary fields of the data plane and the layout
        (:func:`rpeg.runtime.summary.distributed_summary`)."""
        from rpeg.runtime.summary import distributed_summary

        return distributed_summary(
            self.compiled.actor_groups, self._rank_info(), self.sync_log, hist
        )

    # ---------------------------------------------------------------- async rollout
    def rollout(self, step: int) -> dict[str, float]:
        """Generate the batch of ``step`` on the rollout group (the step scheduler admitted
        it); the rows stay on its actors and the driver keeps their Holding (metadata).
        Returns the rollout units' metrics."""
        self.timeline.start_step(step)
        m: dict[str, float] = {}
        for t in self.compiled.tasks_in("rollout"):
            consumer = self._stream_consumer(t)
            if consumer is None:
                m.update(self.run_unit(step, t.name))
                continue
            # streaming across groups: the trainer's forward unit runs on each chunk while
            # the generators produce the next (both issued before either is awaited)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as pool:
                fut = pool.submit(self._run_consumer, step, consumer, t)
                m.update(self.run_unit(step, t.name))
                self._streamed[(step, consumer.name)] = fut.result()
        with self._lock:
            held = self.holdings[(self.compiled.rollout_group, step)]
            if any(s == step for s, _ in self._streamed):
                held = ("streamed", held)  # the trainer already holds the rows
            self.payloads[step] = held
        return m

    def _stream_consumer(self, t: Any) -> Any:
        """The trainer unit that consumes a streaming rollout unit chunk by chunk, or None.

        Only where it is exact: k = 0 (the trainer's weights are the generators'), a
        separate trainer group whose data-parallel size equals the generation one (chunk i of
        generator dp index j is trainer dp index j's), and a forward-only unit (log-probs)
        that needs nothing but the rollout's rows."""
        if not (t.streaming and self.async_rollout and self.k == 0):
            return None
        gen = self.compiled.group(t.group)
        trainer = self.compiled.group(self.compiled.trainer_group)
        if trainer.dp != gen.world_size // gen.gen_tp:
            return None
        rollout = {u.name for u in self.compiled.tasks_in("rollout")}
        for u in self.compiled.tasks_in("train"):
            if u.group != trainer.name:
                continue
            ok = set(u.kinds) <= STREAM_CONSUMER_KINDS and set(u.depends_on) <= rollout
            return u if ok and not u.after else None
        return None

    def _run_consumer(self, step: int, task: Any, producer_task: Any) -> dict[str, float]:
        """Run ``task`` on the trainer group, each rank reading its generator rank's chunks."""
        gen = self.compiled.group(producer_task.group)
        gtp = gen.gen_tp
        producers = self.group(producer_task.group).handles  # each consumer reads its own
        g = self.compiled.group(task.group)
        per_rank = [
            UnitCall(task, stream_from=producers[(r // g.tp) * gtp]) for r in range(g.world_size)
        ]
        return self._finish_unit(step, task, per_rank)

    def take(self, step: int) -> dict[str, float]:
        """Train side: the trainer group pulls the step's rows from the rollout actors (the
        step scheduler checked they are there and within the staleness bound)."""
        with self._lock:
            held = self.payloads.pop(step)
        if isinstance(held, tuple) and held[0] == "streamed":  # the trainer holds them already
            self.group(held[1].group).drop(step)
            self.holdings.pop((held[1].group, step), None)
            return {}
        self._place(step, held, self.compiled.trainer_group)
        return {}

    def _place(self, step: int, held: Any, dst: str) -> None:
        """Rows described by ``held`` (a Holding, or batches restored from a checkpoint) into
        ``dst``; the producers drop them after the pull."""
        from rpeg.runtime.actors.dataplane import Holding

        if not isinstance(held, Holding):
            self.put_sharded(step, dst, held)
            return
        self.pull(step, held, dst)
        if held.group != dst:
            self.group(held.group).drop(step)
            self.holdings.pop((held.group, step), None)

    def payload_batches(self) -> dict[int, list[Any]]:
        """In-flight rollouts as batches (for a checkpoint only: fetched from their actors)."""
        from rpeg.runtime.actors.dataplane import Holding

        out = {}
        with self._lock:
            items = list(self.payloads.items())
        for s, held in items:
            if isinstance(held, tuple):  # streamed: the trainer holds the rows already
                held = self.holdings.get((self.compiled.trainer_group, s), held[1])
            if not isinstance(held, Holding):
                out[s] = held
                continue
            # one replica per dp index; these do pass through the flow process (counted)
            out[s] = self.group(held.group).get_batch(
                s, ranks=[i * held.tp for i in range(held.dp)]
            )
        return out

    def sync_weights(self, step: int) -> dict[str, float]:
        """Weight sync by collective: the trainer ranks gather the full weights, its rank 0
        broadcasts them in ``bucket_bytes`` buckets to every generator rank (which reshards to
        its gen_tp); every ``every_steps`` updates (always at start)."""
        ws = self.compiled.weight_sync
        if not ws.copies:
            return {}
        trainer = self.compiled.trainer_group  # (when to sync: the step scheduler decides)
        t0 = time.perf_counter()
        sends, versions = broadcast_weights(
            self.group(trainer), [self.group(g) for g in ws.targets], ws.bucket_bytes
        )
        sent = sends[0]
        version = int(sent["version"])
        assert all(v == version for v in versions), (versions, version)
        self._synced_once = True
        dt = time.perf_counter() - t0
        nbytes = int(sent.get("weight_sync_bytes", 0))
        self.sync_log.append({"step": step, "weight_sync_s": dt, "weight_sync_bytes": nbytes})
        return {
            "weight_sync_s": dt,
            "weight_sync_bytes": float(nbytes),
            "weight_sync_buckets": float(sent.get("buckets", 0)),
        }

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_url(self, step_done: int) -> str | None:
        return None if self.store is None else self.store.step_url(step_done)

    def checkpoint(self, step_done: int, state: dict[str, Any]) -> dict[str, float]:
        """Save after ``step_done`` steps: trainable ranks; the data cursor, the rows of
        produced rollouts not trained yet, the prompts drawn for later steps, and ``state``
        (the step scheduler's: versions, lags, metrics)."""
        if self.store is None:
            return {}
        t0 = time.perf_counter()
        parts: dict[str, bytes] = {}
        sharded = sorted(g.name for g in self.compiled.actor_groups if _writes_shards(g))
        for g in self.compiled.actor_groups:
            if g.trainable:
                light = g.name in sharded  # its weights and optimizer: the ranks' shards
                for r, data in enumerate(self.group(g.name).state_bytes(light)):
                    parts[f"{g.name}-rank{r}.pt"] = data
        in_flight = self.payload_batches()  # rows of produced rollouts, from their actors
        with self._lock:
            driver = {
                "step": step_done,
                "cursor": self.cursor.state_dict(),
                "payloads": in_flight,
                "slot_examples": {s: e for s, e in self.slot_examples.items() if s >= step_done},
                "scheduler": state,
            }
        parts["driver.pt"] = checkpoint_dumps(driver)
        from rpeg.runtime.actors.checkpoint_identity import model_identity, run_identity

        meta = {
            "policy_version": step_done,
            **run_identity(self.config, self.compiled.actor_groups),
            "staleness": self.k,
            "model": model_identity(self.config.model),
        }

        def write_shards(url: str) -> dict[str, Any]:
            # every rank of a sharded group writes its own shards into the step's folder
            # (torch.distributed.checkpoint); nothing of them passes through this process
            for name in sharded:
                self.group(name).save_shards(f"{url}/{name}{SHARDS_SUFFIX}")
            return {"sharded_groups": sharded}

        info = self.store.save(
            step_done, parts, meta, before_commit=write_shards if sharded else None
        )
        if self.config.runtime.export_hf:  # rank-state checkpoints (not torch.distributed shards)
            from rpeg.runtime.export import export_at_checkpoint

            export_at_checkpoint(self.config, info.path, step_done, print)
        return {
            "checkpoint_s": time.perf_counter() - t0,
            "checkpoint_bytes": float(info.meta["total_bytes"]),
        }

    def restore(self) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into the actors and the driver; return the
        step scheduler state saved with it (None without one)."""
        if self.store is None:
            return None
        got = self.store.latest()
        if got is None:
            return None
        _meta, parts = got
        shards = set(_meta.get("sharded_groups", ()))
        for g in self.compiled.actor_groups:
            if g.trainable and g.name in shards:  # weights and optimizer from the shards
                self.group(g.name).load_shards(f"{_meta['dir_url']}/{g.name}{SHARDS_SUFFIX}")
            if g.trainable:
                self.group(g.name).load_state_bytes(
                    [self._rank_part(parts, g, r) for r in range(g.world_size)]
                )
        d = checkpoint_loads(parts["driver.pt"])
        self.cursor.load_state_dict(d["cursor"])
        with self._lock:
            self.payloads = {int(s): b for s, b in d["payloads"].items()}
            self.slot_examples = {int(s): e for s, e in d["slot_examples"].items()}
        return d["scheduler"]

    def _rank_part(self, parts: dict[str, bytes], g: Any, r: int) -> bytes:
        """Rank ``r`` of group ``g``'s saved state; after a layout change
        (``--allow-change layout``, checked in the preflight: data-parallel replicas only)
        a rank the checkpoint lacks loads its group's rank 0 part -- the replicas are
        identical -- or, for a renamed group, the rank 0 part of the one trainable group
        the checkpoint holds."""
        name = f"{g.name}-rank{r}.pt"
        if name in parts or "layout" not in self.config.runtime.allow_change:
            return parts[name]
        if f"{g.name}-rank0.pt" in parts:
            return parts[f"{g.name}-rank0.pt"]
        firsts = sorted(p for p in parts if p.endswith("-rank0.pt"))
        if len(firsts) != 1:
            raise KeyError(f"{name}: the checkpoint holds {sorted(parts)}; cannot reshard")
        return parts[firsts[0]]

    # ---------------------------------------------------------------- results
    def evaluate(self) -> float:
        """Greedy held-out accuracy of the trainer's current weights."""
        return self.group(self.compiled.trainer_group).evaluate()

    def param_checksums(self) -> list[float]:
        return self.group(self.compiled.trainer_group).param_checksums()

    def step_metrics(self, step: int) -> dict[str, float]:
        """The driver's own metrics of a finished step (the data plane's bytes)."""
        return self.data_plane_metrics(step)
