"""The driver: the data of a run on its actor groups (which ranks hold which step's rows,
in-flight rollouts, prompts drawn per step), weight sync, checkpoints and the measured
timeline. Prefect tasks (``rpeg.tasks``) are thin calls into this object; it decides nothing
about the order of work: the step scheduler (:mod:`rpeg.runtime.step.scheduler`) does, and
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

from rpeg.compile import CompiledStep
from rpeg.config import RunConfig
from rpeg.ir import StageKind
from rpeg.runtime.actors.checkpoint import CheckpointStore
from rpeg.runtime.actors.lifecycle import ActorSet
from rpeg.runtime.actors.proxies import broadcast_weights, join_sync_group
from rpeg.runtime.actors.recorder import TimelineRecorder
from rpeg.runtime.actors.row_shards import prompt_shards
from rpeg.runtime.actors.run_checkpoints import RunCheckpoints
from rpeg.runtime.actors.run_data import Payload, RunDataPlane, Streamed
from rpeg.runtime.actors.unit_call import UnitCall
from rpeg.runtime.actors.unit_chains import step_chains
from rpeg.runtime.actors.unit_result import reduce_results
from rpeg.runtime.samples import keep_samples_upto

log = logging.getLogger(__name__)


#: unit kinds that can consume a streaming rollout chunk by chunk (forward passes only)
STREAM_CONSUMER_KINDS = frozenset({StageKind.ref_logprob, StageKind.old_logprob, StageKind.values})


def _append_samples(out_dir: str, rows: list[Any]) -> None:
    """One logged step's rows -> samples.jsonl, and a few of them printed."""
    from rpeg.runtime import samples as SM

    SM.append_samples(out_dir, rows)
    for line in SM.sample_lines(rows):
        print(line, flush=True)


class DistributedRun(RunDataPlane, RunCheckpoints):
    """Actor groups of a :class:`CompiledStep` on the cluster, and the state of the run."""

    def __init__(self, config: RunConfig, compiled: CompiledStep, cluster: Any):
        from rpeg.runtime.task_data import build_task_data

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
        self.payloads: dict[int, Payload] = {}
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
        # samples.jsonl is appended (and a few rows printed) by a thread of its own, in step
        # order, off the step's path (128 rows cost ~15 ms of JSON); flushed before a
        # checkpoint, a recovery and at close (flush_samples)
        self._samples_writer: Any = None
        self._samples_pending: list[Any] = []
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
        try:
            self.flush_samples()
        finally:
            if self._samples_writer is not None:
                self._samples_writer.shutdown(wait=True)
                self._samples_writer = None

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
        self.flush_samples()  # the rows written before keep_samples_upto trims them
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
            keep_samples_upto(self.config.runtime.output_dir, 0)
            log.warning("no complete checkpoint yet: the run starts again from step 0")
        return state

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
        """A logged step's rows from its advantage unit -> samples.jsonl (+ a few printed),
        appended by the samples thread in step order (``logged_samples`` at once)."""
        if not got:
            return
        from concurrent.futures import ThreadPoolExecutor

        from rpeg.runtime import samples as SM

        rows = SM.merge(got)
        with self._lock:
            done = [f for f in self._samples_pending if f.done()]
            self._samples_pending = [f for f in self._samples_pending if f not in done]
        for f in done:  # an earlier step's failed write fails this unit
            f.result()
        with self._lock:
            self.logged_samples.append(rows)
            if self._samples_writer is None:
                self._samples_writer = ThreadPoolExecutor(1, thread_name_prefix="rpeg-samples")
            self._samples_pending.append(
                self._samples_writer.submit(_append_samples, self.config.runtime.output_dir, rows)
            )

    def flush_samples(self) -> None:
        """Wait until every logged step's rows are in samples.jsonl; a failed write raises."""
        with self._lock:
            pending, self._samples_pending = self._samples_pending, []
        for f in pending:
            f.result()

    def checkpoint(self, step_done: int, state: dict[str, Any]) -> dict[str, float]:
        """:meth:`RunCheckpoints.checkpoint`, the rows of the steps it covers written first
        (a resume keeps samples.jsonl's rows up to the checkpoint's step)."""
        self.flush_samples()
        return super().checkpoint(step_done, state)

    def summary_extras(self, hist: list[dict[str, float]]) -> dict[str, Any]:
        """Run-summary fields of the data plane and the layout
        (:func:`rpeg.runtime.summary.distributed_summary`)."""
        from rpeg.runtime.summary import distributed_summary

        out = distributed_summary(
            self.compiled.actor_groups, self._rank_info(), self.sync_log, hist
        )
        # each rank's predicted peak beside its measured one (rpeg.compile.memory)
        from rpeg.compile.memory import rank_peaks
        from rpeg.errors import RpegError
        from rpeg.specs.hf import priced_model

        try:
            peaks = rank_peaks(self.compiled, self.config, priced_model(self.config.model))
        except RpegError:
            peaks = []
        out["predicted_peak_memory"] = {p.group: p.to_dict() for p in peaks}
        # the cluster's own fields (a Slurm cluster: its workers' job ids; rpeg.infra.cluster)
        fields = getattr(self.cluster, "summary_fields", None)
        extra = fields() if callable(fields) else None
        if isinstance(extra, dict):
            out.update(extra)
        return out

    def release_nowait(self, step: int) -> list[Any]:
        """:meth:`release` without waiting for the ranks: each rank holding the step's rows
        is sent its drop now (it runs when the rank's actor thread is free; nothing later
        reads the step's rows), and the calls' futures are returned for the caller to check
        later (``future.result()`` raises a failed drop's error)."""
        drops: list[Any] = []
        for g in sorted({g for (g, s) in list(self.holdings) if s == step}):
            with self.client.as_current():
                drops += [h.drop(step) for h in self.group(g).handles]
            self.holdings.pop((g, step), None)
        self.release(step)  # the rest: the step's prompts and chained results
        return drops

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
                held = Streamed(held)  # the trainer already holds the rows
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
            UnitCall(task, stream_from=producers[(r // g.replica_ranks) * gtp])
            for r in range(g.world_size)
        ]
        return self._finish_unit(step, task, per_rank)

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

    # ---------------------------------------------------------------- results
    def evaluate(self) -> dict[str, float]:
        """Validation metrics (``val/accuracy``, ...: rpeg.runtime.validation) of the
        trainer's current weights on the held-out prompts."""
        return self.group(self.compiled.trainer_group).evaluate()

    def param_checksums(self) -> list[float]:
        return self.group(self.compiled.trainer_group).param_checksums()

    def step_metrics(self, step: int) -> dict[str, float]:
        """The driver's own metrics of a finished step (the data plane's bytes)."""
        return self.data_plane_metrics(step)
