"""The data of a distributed run, two parts of :class:`rpeg.runtime.actors.driver.DistributedRun`:

* :class:`RunData`, its data plane on the actor groups: which ranks hold which step's rows
  (:class:`rpeg.runtime.actors.dataplane.Holding` per group and step), the rows a unit pulls
  from other groups before it runs (actor to actor; the driver only plans the slices), the
  rollouts in the staleness buffer (:data:`Payload`), what a step leaves to release, and the
  bytes each step moved;
* :class:`Prompts`, the prompts each step draws from the task's data cursor (once per step).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rpeg.compile.step import CompiledStep, TaskSpec
from rpeg.runtime.actors.dataplane import Holding
from rpeg.runtime.actors.proxies import RankGroup
from rpeg.runtime.actors.row_shards import shard_groups
from rpeg.runtime.actors.unit_chains import arrives_by_take, unit_layout
from rpeg.runtime.batch import RolloutBatch

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


@dataclass(frozen=True)
class Streamed:
    """A rollout whose rows the trainer group already holds (it consumed the generators'
    stream chunk by chunk); ``holding``: the generator group's copy, dropped at take."""

    holding: Holding


#: a rollout in the staleness buffer: rows on the rollout group's actors, rows the trainer
#: already holds, or batches restored from a checkpoint (put into the trainer at take)
Payload = Holding | Streamed | list[RolloutBatch]


class Prompts:
    """The prompts of each step, drawn from the task's data ``cursor`` once (``per_step`` of
    them): every unit of a step, and its checkpoint, see the same ones."""

    def __init__(self, cursor: Any, per_step: int):
        self.cursor = cursor
        self.per_step = per_step
        self.by_step: dict[int, list[Any]] = {}
        self.initial = cursor.state_dict()  # a recovery before any checkpoint starts here
        self._lock = threading.Lock()

    def of(self, step: int) -> list[Any]:
        with self._lock:
            if step not in self.by_step:
                self.by_step[step] = self.cursor.next(self.per_step)
            return self.by_step[step]

    def drop(self, step: int) -> None:
        with self._lock:
            self.by_step.pop(step, None)

    def state(self, from_step: int) -> dict[str, Any]:
        """What a checkpoint after ``from_step`` steps keeps: the cursor and the prompts drawn
        for later steps."""
        with self._lock:
            later = {s: e for s, e in self.by_step.items() if s >= from_step}
            return {"cursor": self.cursor.state_dict(), "slot_examples": later}

    def load(self, state: dict[str, Any]) -> None:
        """A checkpoint's :meth:`state` back."""
        self.cursor.load_state_dict(state["cursor"])
        with self._lock:
            self.by_step = {int(s): e for s, e in state["slot_examples"].items()}

    def forget(self, *, restart: bool = False) -> None:
        """Drop every step's prompts (a recovery); ``restart``: the cursor back at its start
        too (lost before the first checkpoint)."""
        with self._lock:
            self.by_step.clear()
        if restart:
            self.cursor.load_state_dict(self.initial)


class RunData:
    """The data plane of a run between its groups. ``group(name)``: the typed proxy of a
    group (:class:`rpeg.runtime.actors.proxies.RankGroup`)."""

    def __init__(
        self, compiled: CompiledStep, samples_per_prompt: int, group: Callable[[str], RankGroup]
    ):
        self.compiled = compiled
        self.samples_per_prompt = samples_per_prompt
        self.group = group
        # step -> Payload of the rollouts in the staleness buffer; the tensors stay on the
        # rollout actors until the trainer pulls them
        self.payloads: dict[int, Payload] = {}
        self.holdings: dict[tuple[str, int], Holding] = {}  # (group, step) -> Holding
        self.driver_bytes: dict[int, int] = {}  # step -> tensor bytes through this process
        self.batch_bytes: dict[int, int] = {}  # step -> tensor bytes of the step's batch
        self.pulled_bytes: dict[int, int] = {}  # step -> tensor bytes moved actor to actor
        self._lock = threading.Lock()

    def count_driver_bytes(self, step: int, nbytes: int) -> None:
        """Tensor bytes of ``step`` that passed through the flow process (the groups' data
        methods report them: ``driver_bytes_per_step``)."""
        with self._lock:
            self.driver_bytes[step] = self.driver_bytes.get(step, 0) + nbytes

    def put_sharded(self, step: int, dst: str, batches: list[Any]) -> None:
        """Driver-held batches into ``dst`` (sharded by its dp, replicated over its tp): the
        restore path of in-flight rollouts only; steps move batches actor to actor."""
        g = self.compiled.group(dst)
        whole = RolloutBatch.concat(batches) if len(batches) > 1 else batches[0]
        idx = shard_groups(whole.size, g.dp, self.samples_per_prompt)
        parts = [whole.select(torch.tensor(i, dtype=torch.long)) for i in idx]
        self.group(dst).put_batch(step, [parts[r // g.replica_ranks] for r in range(g.world_size)])
        self.holdings[(dst, step)] = Holding(
            dst, g.dp, g.replica_ranks, tuple(p.size for p in parts)
        )

    def pull(self, step: int, src: Holding, dst: str, fields: list[str] | None = None) -> int:
        """``dst``'s ranks fetch their rows of ``src`` (a Holding) from its actors directly;
        ``fields``: only those fields, merged into the rows ``dst`` already holds. Returns the
        tensor bytes moved actor to actor."""
        from rpeg.runtime.actors.dataplane import plan_pull

        g = self.compiled.group(dst)
        slices, sizes = plan_pull(src, g.dp, g.replica_ranks, self.samples_per_prompt)
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
            self.holdings[(dst, step)] = Holding(dst, g.dp, g.replica_ranks, sizes)
        n = int(sum(got))
        with self._lock:
            self.pulled_bytes[step] = self.pulled_bytes.get(step, 0) + n
        return n

    def merge_inputs(self, step: int, task: TaskSpec) -> None:
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
        dp, _tp = unit_layout(self.compiled.group(task.group), task)
        gs = self.samples_per_prompt
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

    def hold(self, step: int, task: TaskSpec, rows: list[Any], nbytes: list[int]) -> None:
        """The rows a unit left on its group (each rank's row count, ``None`` when it left
        none) and their bytes: the step's batch at its largest (every field filled in)."""
        if not rows or rows[0] is None:
            return
        dp, tp = unit_layout(self.compiled.group(task.group), task)
        self.holdings[(task.group, step)] = Holding(
            task.group, dp, tp, tuple(rows[i * tp] for i in range(dp))
        )
        with self._lock:
            self.batch_bytes[step] = max(
                self.batch_bytes.get(step, 0), sum(nbytes[i * tp] for i in range(dp))
            )

    def buffer_rollout(self, step: int, *, streamed: bool) -> None:
        """The rollout of ``step`` into the staleness buffer (the rows its rollout group
        holds; ``streamed``: the trainer consumed them chunk by chunk and holds them too)."""
        with self._lock:
            held = self.holdings[(self.compiled.rollout_group, step)]
            self.payloads[step] = Streamed(held) if streamed else held

    def take(self, step: int) -> dict[str, float]:
        """Train side: the trainer group pulls the step's rows from the rollout actors (the
        step scheduler checked they are there and within the staleness bound)."""
        with self._lock:
            held = self.payloads.pop(step)
        if isinstance(held, Streamed):  # the trainer holds them already
            self.group(held.holding.group).drop(step)
            self.holdings.pop((held.holding.group, step), None)
            return {}
        self._place(step, held, self.compiled.trainer_group)
        return {}

    def _place(self, step: int, held: Holding | list[RolloutBatch], dst: str) -> None:
        """Rows described by ``held`` (a Holding, or batches restored from a checkpoint) into
        ``dst``; the producers drop them after the pull."""
        if not isinstance(held, Holding):
            self.put_sharded(step, dst, held)
            return
        self.pull(step, held, dst)
        if held.group != dst:
            self.group(held.group).drop(step)
            self.holdings.pop((held.group, step), None)

    def release(self, step: int) -> None:
        """Drop the step's rows on every group that holds them."""
        for g in [g for (g, s) in list(self.holdings) if s == step]:
            self.group(g).drop(step)
            self.holdings.pop((g, step), None)

    def release_nowait(self, step: int, client: Any) -> list[Any]:
        """:meth:`release` without waiting for the ranks: each rank holding the step's rows
        is sent its drop now; the calls' futures are returned."""
        drops: list[Any] = []
        for g in sorted({g for (g, s) in list(self.holdings) if s == step}):
            with client.as_current():
                drops += [h.drop(step) for h in self.group(g).handles]
            self.holdings.pop((g, step), None)
        return drops

    def metrics(self, step: int) -> dict[str, float]:
        """Bytes of the step: through the flow process, of the batch, actor to actor."""
        with self._lock:
            return {
                "driver_bytes": float(self.driver_bytes.get(step, 0)),
                "batch_bytes": float(self.batch_bytes.get(step, 0)),
                "actor_to_actor_bytes": float(self.pulled_bytes.get(step, 0)),
            }

    def payload_batches(self) -> dict[int, list[Any]]:
        """In-flight rollouts as batches (for a checkpoint only: fetched from their actors)."""
        out = {}
        with self._lock:
            items = list(self.payloads.items())
        for s, held in items:
            if isinstance(held, Streamed):  # the trainer holds the rows already
                held = self.holdings.get((self.compiled.trainer_group, s), held.holding)
            if not isinstance(held, Holding):
                out[s] = held
                continue
            # one replica per dp index; these do pass through the flow process (counted)
            out[s] = self.group(held.group).get_batch(
                s, ranks=[i * held.tp for i in range(held.dp)]
            )
        return out

    def load_payloads(self, payloads: dict[Any, list[Any]]) -> None:
        """A checkpoint's in-flight rollouts (batches) into the staleness buffer."""
        with self._lock:
            self.payloads = {int(s): b for s, b in payloads.items()}

    def forget(self) -> None:
        """A recovery: the rows held on the old actors are gone."""
        with self._lock:
            self.payloads.clear()
            self.holdings.clear()
