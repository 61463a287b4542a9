"""The driver: a distributed run's actor groups and its state, as a holder of named parts.
Prefect tasks (``rpeg.tasks``) are thin calls into this object; it decides nothing about the
order of work: the step scheduler (:mod:`rpeg.runtime.step.scheduler`) does, and the flow
(``rpeg.flows.train``) executes its instructions.

Its parts, each a class of its own module:

* ``actors``: :class:`rpeg.runtime.actors.lifecycle.ActorSet` (start, close, abandon and
  re-create the actors; typed proxies per group; what each rank holds, for the summary);
* ``data``: :class:`rpeg.runtime.actors.run_data.RunData` (which ranks hold which step's
  rows, pulls between groups, the staleness buffer, bytes moved per step);
* ``prompts``: :class:`rpeg.runtime.actors.run_data.Prompts` (the prompts each step draws);
* ``units``: :class:`rpeg.runtime.actors.run_units.UnitRunner` (units, chains of units and
  streamed rollouts on the groups);
* ``samples``: :class:`rpeg.runtime.actors.run_samples.SampleLog` (samples.jsonl);
* ``checkpoints``: :class:`rpeg.runtime.actors.run_checkpoints.RunCheckpoints` (save and
  restore through the run's checkpoint store);
* ``timeline``: :class:`rpeg.runtime.actors.recorder.TimelineRecorder`.

The weight sync (which needs the trainer and generator groups together) and recovery (which
touches every part) are its own methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from rpeg.compile import CompiledStep
from rpeg.config import RunConfig
from rpeg.runtime.actors.checkpoint import CheckpointStore
from rpeg.runtime.actors.lifecycle import ActorSet
from rpeg.runtime.actors.proxies import RankGroup, broadcast_weights, join_sync_group
from rpeg.runtime.actors.recorder import TimelineRecorder
from rpeg.runtime.actors.run_checkpoints import RunCheckpoints
from rpeg.runtime.actors.run_data import Prompts, RunData
from rpeg.runtime.actors.run_samples import SampleLog
from rpeg.runtime.actors.run_units import UnitRunner
from rpeg.runtime.samples import keep_samples_upto

log = logging.getLogger(__name__)


class DistributedRun:
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

        rt = config.runtime
        # the prompts exactly as the ranks' policy gets them (chat template, length policy)
        cursor, _ = build_task_data(
            config.task, task_tokenizer(config), config.workload.max_prompt_tokens
        )
        self.prompts = Prompts(cursor, config.workload.num_prompts)
        self.cursor = cursor  # the task's data cursor (the prompts' source)
        self.data = RunData(compiled, config.workload.samples_per_prompt, self.group)
        self.driver_bytes = self.data.driver_bytes  # step -> tensor bytes through the driver
        self.pulled_bytes = self.data.pulled_bytes  # step -> tensor bytes actor to actor
        self.timeline = TimelineRecorder()
        self.actors = ActorSet(
            config, compiled, cluster, self.async_rollout, count_bytes=self.data.count_driver_bytes
        )
        # samples.jsonl: a new run starts a new file (the writer thread: run_samples)
        self.samples = SampleLog(rt.output_dir, fresh=not (rt.resume or rt.resume_from))
        self.logged_samples = self.samples.logged  # rpeg.runtime.samples rows, per logged step
        self.units = UnitRunner(
            compiled, self.group, self.data, self.prompts, self.timeline, self.samples
        )
        self.store = CheckpointStore.for_run(rt) if rt.checkpoint_url else None
        self.checkpoints = RunCheckpoints(
            config, compiled, self.store, self.group, self.data, self.prompts
        )
        self._synced_once = False
        self.sync_log: list[dict[str, float]] = []

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

    def group(self, name: str) -> RankGroup:
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

    def close(self, timeout_s: float = 30.0) -> None:
        """Tear down every actor's process group and drop the handles (after keeping what
        each rank holds and its peak memory, for the summary); samples.jsonl written."""
        self.actors.rank_info()
        self.actors.close(timeout_s)
        self.samples.close()

    # ---------------------------------------------------------------- recovery
    def abandon(self) -> None:
        """A worker was lost: restart or close the surviving actors (``ActorSet.abandon``)."""
        self.actors.abandon()

    def recover(self, timeout_s: float = 90.0) -> dict[str, Any] | None:
        """After :meth:`abandon` and once no task runs: forget the data held on the old
        actors, re-create every actor on the live workers and load the newest complete
        checkpoint. Returns its step scheduler state; None when no checkpoint has committed
        yet (the actors are fresh and the data cursor is back at its start: the caller
        restarts the step scheduler from its initial state -- the same run again)."""
        self.samples.flush()  # the rows written before keep_samples_upto trims them
        self.data.forget()
        self.units.forget()
        self.prompts.forget()
        self.restart_actors(timeout_s)
        state = self.checkpoints.restore()
        if state is None:  # lost before the first checkpoint committed: start over
            self.prompts.forget(restart=True)
            keep_samples_upto(self.config.runtime.output_dir, 0)
            log.warning("no complete checkpoint yet: the run starts again from step 0")
        return state

    # ---------------------------------------------------------------- steps
    def examples_for(self, step: int) -> list[Any]:
        """The prompts of ``step`` (drawn once)."""
        return self.prompts.of(step)

    def run_unit(self, step: int, task_name: str) -> dict[str, float]:
        """Run one execution unit of ``step`` on its actor group (:class:`UnitRunner`)."""
        return self.units.run(step, task_name)

    def rollout(self, step: int) -> dict[str, float]:
        """Generate the batch of ``step`` on the rollout group (the step scheduler admitted
        it); the rows stay on its actors and the data plane keeps their Holding (metadata).
        Returns the rollout units' metrics."""
        return self.units.rollout(step, stream_across=self.async_rollout and self.k == 0)

    def take(self, step: int) -> dict[str, float]:
        """Train side: the trainer group pulls the step's rows from the rollout actors."""
        return self.data.take(step)

    def release(self, step: int) -> None:
        """Drop the step's rows on every group that holds them, its prompts and the results
        kept for its chains."""
        self.data.release(step)
        self.prompts.drop(step)
        self.units.forget_step(step)

    def release_nowait(self, step: int) -> list[Any]:
        """:meth:`release` without waiting for the ranks: each rank holding the step's rows
        is sent its drop now (it runs when the rank's actor thread is free; nothing later
        reads the step's rows), and the calls' futures are returned for the caller to check
        later (``future.result()`` raises a failed drop's error)."""
        drops = self.data.release_nowait(step, self.client)
        self.release(step)  # the rest: the step's prompts and chained results
        return drops

    def data_plane_metrics(self, step: int) -> dict[str, float]:
        """Bytes of the step: through the flow process, of the batch, actor to actor."""
        return self.data.metrics(step)

    def step_metrics(self, step: int) -> dict[str, float]:
        """The driver's own metrics of a finished step (the data plane's bytes)."""
        return self.data.metrics(step)

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_url(self, step_done: int) -> str | None:
        return self.checkpoints.url(step_done)

    def checkpoint(self, step_done: int, state: dict[str, Any]) -> dict[str, float]:
        """:meth:`RunCheckpoints.save`, the rows of the steps it covers written first (a
        resume keeps samples.jsonl's rows up to the checkpoint's step)."""
        self.samples.flush()
        return self.checkpoints.save(step_done, state)

    def restore(self) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into the actors and the driver; return the
        step scheduler state saved with it (None without one)."""
        return self.checkpoints.restore()

    # ---------------------------------------------------------------- weights
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

    def summary_extras(self, hist: list[dict[str, float]]) -> dict[str, Any]:
        """Run-summary fields of the data plane and the layout
        (:func:`rpeg.runtime.summary.distributed_summary`)."""
        from rpeg.runtime.summary import distributed_summary

        out = distributed_summary(
            self.compiled.actor_groups, self.actors.rank_info(), self.sync_log, hist
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
