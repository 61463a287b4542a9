"""Running a step's execution units on their actor groups (a part of
:class:`rpeg.runtime.actors.driver.DistributedRun`): one unit as one call per rank of its
group; a row of units on one group (:mod:`rpeg.runtime.actors.unit_chains`) as one call per
rank, the later units' results kept until the step scheduler asks for them; a rollout whose
trainer-side forward unit consumes the generators' stream chunk by chunk (streaming across
groups). Each unit's rows go to the data plane, its spans to the timeline, its logged samples
to the sample log."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rpeg.compile.step import CompiledStep, TaskSpec
from rpeg.ir import StageKind
from rpeg.runtime.actors.proxies import RankGroup
from rpeg.runtime.actors.recorder import TimelineRecorder
from rpeg.runtime.actors.row_shards import prompt_shards
from rpeg.runtime.actors.run_data import Prompts, RunData
from rpeg.runtime.actors.run_samples import SampleLog
from rpeg.runtime.actors.unit_call import UnitCall
from rpeg.runtime.actors.unit_chains import step_chains, unit_layout
from rpeg.runtime.actors.unit_result import reduce_results

#: unit kinds that can consume a streaming rollout chunk by chunk (forward passes only)
STREAM_CONSUMER_KINDS = frozenset({StageKind.ref_logprob, StageKind.old_logprob, StageKind.values})


class UnitRunner:
    """The units of a compiled step on its groups (``group(name)``: the typed proxy)."""

    def __init__(
        self,
        compiled: CompiledStep,
        group: Callable[[str], RankGroup],
        data: RunData,
        prompts: Prompts,
        timeline: TimelineRecorder,
        samples: SampleLog,
    ):
        self.compiled = compiled
        self.group = group
        self.data = data
        self.prompts = prompts
        self.timeline = timeline
        self.samples = samples
        # chains of units issued as one call per rank (unit_chains): head -> its units, and
        # the results of the later units of a chain that ran, until the scheduler asks
        self.chains = {c[0]: c for c in step_chains(compiled) if len(c) > 1}
        self.chained: dict[tuple[int, str], dict[str, float]] = {}
        self.tails: dict[tuple[int, str], tuple[str, ...]] = {}  # a streamed head's rest
        self.streamed: dict[tuple[int, str], dict[str, float]] = {}  # units run on chunks
        self._lock = threading.Lock()

    def run(self, step: int, task_name: str) -> dict[str, float]:
        """Run one execution unit of ``step`` on its actor group; record its span. The unit
        runs with its compiled micro-batch size and, when it streams, in chunks."""
        task = self.compiled.task(task_name)
        g = self.compiled.group(task.group)
        dp, tp = unit_layout(g, task)
        chain = self.chains.get(task_name)
        done = self.streamed.pop((step, task_name), None)
        if done is not None:  # ran on the rollout's chunks already (streaming across groups)
            if chain is not None and len(chain) > 2:  # the rest of its chain still goes as one
                with self._lock:
                    self.tails[(step, chain[1])] = chain[1:]
            return done
        with self._lock:
            done = self.chained.pop((step, task_name), None)
            chain = self.tails.pop((step, task_name), chain)
        if done is not None:  # ran in its chain's call already
            return done
        t0 = time.perf_counter()
        self.timeline.start_step(step)
        if task.generates:
            shards = prompt_shards(self.prompts.of(step), dp)
            per_rank = [UnitCall(task, shards[r // tp]) for r in range(g.world_size)]
        else:
            self.data.merge_inputs(step, task)
            per_rank = [UnitCall(task)] * g.world_size
        if chain is not None:
            return self._run_chain(step, chain, per_rank, t0)
        return self._finish(step, task, per_rank, t0)

    def rollout(self, step: int, *, stream_across: bool) -> dict[str, float]:
        """The rollout units of ``step`` on the rollout group; the rows stay on its actors and
        go into the staleness buffer (metadata only). ``stream_across``: a trainer forward
        unit may consume the stream (k = 0, async rollout). Returns the units' metrics."""
        self.timeline.start_step(step)
        m: dict[str, float] = {}
        for t in self.compiled.tasks_in("rollout"):
            consumer = self._stream_consumer(t) if stream_across else None
            if consumer is None:
                m.update(self.run(step, t.name))
                continue
            # streaming across groups: the trainer's forward unit runs on each chunk while
            # the generators produce the next (both issued before either is awaited)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as pool:
                fut = pool.submit(self._run_consumer, step, consumer, t)
                m.update(self.run(step, t.name))
                self.streamed[(step, consumer.name)] = fut.result()
        with self._lock:
            streamed = any(s == step for s, _ in self.streamed)
        self.data.buffer_rollout(step, streamed=streamed)
        return m

    def forget_step(self, step: int) -> None:
        """The step is released: its chained results and chain tails go."""
        with self._lock:
            for kept in (self.chained, self.tails):
                for key in [k for k in kept if k[0] == step]:
                    del kept[key]

    def forget(self) -> None:
        """A recovery: every kept result goes (the actors that made them are gone)."""
        with self._lock:
            self.streamed.clear()
            self.chained.clear()
            self.tails.clear()

    def _run_chain(
        self, step: int, chain: tuple[str, ...], head: list[UnitCall], t0: float
    ) -> dict[str, float]:
        """The units of ``chain`` in one call per rank (``head``: the first unit's per-rank
        calls; the others need nothing but their unit); records each unit as
        :meth:`_finish` does and keeps the later units' metrics for the scheduler."""
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
            outs.append(self._record(step, t, unit_res, start, max(end, start)))
            start = max(end, start)
        with self._lock:
            for t, out in zip(tasks[1:], outs[1:], strict=True):
                self.chained[(step, t.name)] = out
        return outs[0]

    def _finish(
        self, step: int, task: TaskSpec, per_rank: list[UnitCall], t0: float | None = None
    ) -> dict[str, float]:
        """Issue the unit on every rank of its group; record the rows it leaves, its spans."""
        t0 = time.perf_counter() if t0 is None else t0
        res = self.group(task.group).run_unit(step, per_rank)
        return self._record(step, task, res, t0, time.perf_counter())

    def _record(
        self, step: int, task: TaskSpec, res: list[Any], t0: float, t1: float
    ) -> dict[str, float]:
        """The rows ``task`` left on its group, its spans and timeline record; its metrics."""
        g = self.compiled.group(task.group)
        self.data.hold(step, task, [r.rows for r in res], [r.batch_bytes for r in res])
        for r, u in enumerate(res):
            spans = [(sp.stage, sp.start, sp.end) for sp in u.spans]
            self.timeline.add_stage_spans(step, task.name, r, u.pid, spans)
            self.timeline.add_pipeline_actions(step, task.name, r, u.actions)
        from rpeg.plan import format_devices

        self.timeline.add(
            step, task.name, format_devices(tuple(g.devices)), t0, t1, kind="+".join(task.kinds)
        )
        self.samples.write([s for u in res for s in u.samples])
        out = reduce_results(res)
        out[f"unit_s/{task.name}"] = out.get("unit_s", t1 - t0)
        return out

    def _stream_consumer(self, t: TaskSpec) -> TaskSpec | None:
        """The trainer unit that consumes a streaming rollout unit chunk by chunk, or None.

        Only where it is exact: k = 0 (the trainer's weights are the generators'), a
        separate trainer group whose data-parallel size equals the generation one (chunk i of
        generator dp index j is trainer dp index j's), and a forward-only unit (log-probs)
        that needs nothing but the rollout's rows."""
        if not t.streaming:
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

    def _run_consumer(self, step: int, task: TaskSpec, producer_task: TaskSpec) -> dict[str, float]:
        """Run ``task`` on the trainer group, each rank reading its generator rank's chunks."""
        gen = self.compiled.group(producer_task.group)
        gtp = gen.gen_tp
        producers = self.group(producer_task.group).handles  # each consumer reads its own
        g = self.compiled.group(task.group)
        per_rank = [
            UnitCall(task, stream_from=producers[(r // g.replica_ranks) * gtp])
            for r in range(g.world_size)
        ]
        return self._finish(step, task, per_rank)


__all__ = ["STREAM_CONSUMER_KINDS", "UnitRunner"]
