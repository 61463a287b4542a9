"""The run's data plane on its actor groups: which ranks hold which step's rows
(:class:`rpeg.runtime.actors.dataplane.Holding` per group and step), the rows a unit pulls
from other groups before it runs (actor to actor; the driver only plans the slices), the
rollouts in the staleness buffer (:data:`Payload`) and what a step leaves to release. A
mixin of :class:`rpeg.runtime.actors.driver.DistributedRun` (its ``compiled``, ``config``,
``holdings``, ``payloads``, ``pulled_bytes``, ``_lock`` and groups)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rpeg.runtime.actors.dataplane import Holding
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


class RunDataPlane:
    """Data movement of a run between its groups."""

    def put_sharded(self, step: int, dst: str, batches: list[Any]) -> None:
        """Driver-held batches into ``dst`` (sharded by its dp, replicated over its tp): the
        restore path of in-flight rollouts only; steps move batches actor to actor."""
        from rpeg.runtime.actors.dataplane import Holding
        from rpeg.runtime.batch import RolloutBatch

        g = self.compiled.group(dst)
        whole = RolloutBatch.concat(batches) if len(batches) > 1 else batches[0]
        idx = shard_groups(whole.size, g.dp, self.config.workload.samples_per_prompt)
        parts = [whole.select(torch.tensor(i, dtype=torch.long)) for i in idx]
        self.group(dst).put_batch(step, [parts[r // g.replica_ranks] for r in range(g.world_size)])
        self.holdings[(dst, step)] = Holding(
            dst, g.dp, g.replica_ranks, tuple(p.size for p in parts)
        )

    def _layout(self, task: Any) -> tuple[int, int]:
        """(dp, tp) the ranks of ``task``'s group run it at (generation: gen_tp)."""
        return unit_layout(self.compiled.group(task.group), task)

    def pull(self, step: int, src: Any, dst: str, fields: list[str] | None = None) -> int:
        """``dst``'s ranks fetch their rows of ``src`` (a Holding) from its actors directly;
        ``fields``: only those fields, merged into the rows ``dst`` already holds. Returns the
        tensor bytes moved actor to actor."""
        from rpeg.runtime.actors.dataplane import Holding, plan_pull

        g = self.compiled.group(dst)
        slices, sizes = plan_pull(
            src, g.dp, g.replica_ranks, self.config.workload.samples_per_prompt
        )
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
