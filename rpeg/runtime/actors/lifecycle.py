"""The lifecycle of a run's actors: start (placement, process groups), close, and the two
halves of a recovery (abandon the survivors, re-create every actor on live workers).

One ``RankActor`` per rank, placed on the worker of its device (device i -> the i-th
worker sorted by name); a group of several ranks joins a torch.distributed process group
(every rank issued before waiting).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rpeg.runtime.actors.proxies import ByteCounter, RankGroup

if TYPE_CHECKING:
    from rpeg.compile.rank_program import RankProgram
    from rpeg.compile.step import CompiledStep, GroupSpec
    from rpeg.config import RunConfig


def _now() -> float:
    return time.monotonic()


class ActorSet:
    """The actors of a compiled step on a cluster (``rpeg.infra.cluster`` object)."""

    def __init__(
        self,
        config: RunConfig,
        compiled: CompiledStep,
        cluster: Any,
        async_rollout: bool,
        count_bytes: ByteCounter | None = None,
    ):
        self.config = config
        self.compiled = compiled
        self.cluster = cluster
        self.client = cluster.client
        self.async_rollout = async_rollout
        self.groups: dict[str, RankGroup] = {}
        self.placement: dict[tuple[str, int], str] = {}  # (group, rank) -> worker address
        self.n_workers: int | None = None  # workers seen at the first start
        self.start_s = 0.0
        self.count_bytes = count_bytes  # given to every group (RankGroup's data methods)
        self._rank_info: dict[str, list[tuple[Any, Any]]] = {}  # kept from the last answer
        #: group -> what its ranks run (rpeg.compile.rank_program), resolved at the first start
        self.programs: dict[str, RankProgram] = {}

    def group(self, name: str) -> RankGroup:
        return self.groups[name]

    def handles(self) -> dict[str, list[Any]]:
        """Raw actor handles per group (for code that calls actors directly)."""
        return {n: g.handles for n, g in self.groups.items()}

    def rank_info(self, timeout_s: float = 10.0) -> dict[str, list[tuple[Any, Any]]]:
        """Per group: (layout_info, memory_info) of every rank, kept from the last call made
        while the actors were up (a rank that does not answer in ``timeout_s`` -- lost, or
        stuck in a collective -- leaves its group out): the run's summary reads it after
        :meth:`close`."""
        if not self.groups:
            return self._rank_info
        info: dict[str, list[tuple[Any, Any]]] = {}
        for name, group in self.groups.items():
            with contextlib.suppress(Exception):
                info[name] = group.rank_info(timeout_s)
        self._rank_info = info
        return info

    # ---------------------------------------------------------------- start / close
    def start(self, workers: Sequence[str] | None = None) -> None:
        """One actor per rank, then each group's process group. ``workers``: live worker
        addresses sorted by name (default: the scheduler's list)."""
        from rpeg.runtime.actors.rank import RankActor

        workers = list(workers) if workers else self.listed_workers()
        if self.n_workers is None:
            self.n_workers = len(workers)
        t0 = time.perf_counter()
        self.placement = {
            (g.name, rank): workers[dev % len(workers)]
            for g in self.compiled.actor_groups
            for rank, dev in enumerate(g.devices)
        }
        slots = self._cpu_slots()
        gpus = self._gpu_slots()
        programs = self._programs()  # no config text: each group's RankProgram
        with self.client.as_current():
            futs = {}
            for g in self.compiled.actor_groups:
                for rank in range(g.world_size):
                    addr = self.placement[(g.name, rank)]
                    futs[(g.name, rank)] = self.client.submit(
                        RankActor,
                        programs[g.name],
                        rank,
                        cpu_slot=slots.get(addr),
                        gpu_slot=gpus.get(addr),
                        actor=True,
                        workers=[addr],
                        allow_other_workers=False,
                        pure=False,
                    )
            self.groups = {
                g.name: RankGroup(
                    self.client,
                    g.name,
                    [futs[(g.name, r)].result() for r in range(g.world_size)],
                    self.count_bytes,
                )
                for g in self.compiled.actor_groups
            }
        for group in self.groups.values():
            group.join_process_group()
        self.start_s = time.perf_counter() - t0

    def _programs(self) -> dict[str, RankProgram]:
        """Each group's :class:`rpeg.compile.rank_program.RankProgram`, resolved once per run
        (rpeg.runtime.actors.programs): the engine rule with vLLM's availability on the
        group's workers, the collective timeout from the predicted step."""
        if self.programs:
            return self.programs
        from rpeg.runtime.actors.programs import asks_vllm, run_programs, workers_have_vllm

        def vllm_on(g: GroupSpec) -> bool | None:
            if not asks_vllm(self.config, g):
                return None
            used = list(dict.fromkeys(self.placement[(g.name, r)] for r in range(g.world_size)))
            return workers_have_vllm(self.client, used)

        self.programs = run_programs(
            self.config, self.compiled, vllm_on, async_rollout=self.async_rollout
        )
        return self.programs

    def listed_workers(self, timeout_s: float = 90.0) -> list[str]:
        """The scheduler's workers; while it lists none (a cluster whose workers are still
        starting, or restarting after a previous run's recovery), wait up to ``timeout_s``
        for them instead of placing ranks on nothing."""
        workers: list[str] = self.cluster.workers
        if workers:
            return workers
        try:
            return self._wait_live(timeout_s)
        except TimeoutError as e:
            raise RuntimeError(
                f"no Dask worker joined the scheduler within {timeout_s:.0f} s; the plan "
                f"needs {max(self.compiled.num_devices, 1)} (cluster.n_workers, or start "
                "workers against cluster.address)"
            ) from e

    def _cpu_slots(self) -> dict[str, tuple[int, int]]:
        """Each used worker's ``(slot, workers of this run on its host)``, workers in
        placement order, hosts by the workers' own host names (network namespaces of one
        machine share one); {} when ``runtime.cpu_binding`` is ``none``
        (rpeg.runtime.cpu_binding)."""
        if self.config.runtime.cpu_binding == "none":
            return {}
        import socket

        from rpeg.runtime.cpu_binding import worker_slots

        used = list(dict.fromkeys(self.placement.values()))
        hosts = self.client.run(socket.gethostname, workers=used)
        return dict(zip(used, worker_slots([hosts[a] for a in used]), strict=True))

    def _gpu_slots(self) -> dict[str, int]:
        """Each used worker's own GPU (a local CUDA index) from what the workers see
        (rpeg.runtime.actors.rendezvous.gpu_slots); {} when no group runs on CUDA."""
        if not any(g.device_type == "cuda" for g in self.compiled.actor_groups):
            return {}
        from rpeg.runtime.actors.rendezvous import gpu_slots, worker_gpus

        used = list(dict.fromkeys(self.placement.values()))
        views = self.client.run(worker_gpus, workers=used)
        return gpu_slots({a: views[a] for a in used})

    def close(self, timeout_s: float = 30.0) -> None:
        """Tear down every rank's process group and drop the handles."""
        for g in self.groups.values():
            g.close(timeout_s)
        self.groups = {}

    # ---------------------------------------------------------------- recovery
    def abandon(self, timeout_s: float = 90.0, failed_groups: frozenset[str] = frozenset()) -> None:
        """After a lost worker: the recovery state machine (rpeg.runtime.step.recovery)
        decides which survivors are kept (their actors closed, the process stays) and which
        are ended (they share a collective with a broken rank: the process exits, its nanny
        starts a fresh one), waits for the cluster to be whole again and keeps the workers
        to start the actors on (:meth:`recreate`). ``failed_groups``: groups whose
        collective broke (every rank's process may answer: a timed-out collective)."""
        from rpeg.runtime.step import recovery as R

        need = max(self.compiled.num_devices, 1)
        expect = max(self.n_workers or need, need)
        machine = R.Recovery(R.topology_of(self.compiled, self.placement), expect, need, timeout_s)
        workers = sorted(set(self.placement.values()))
        todo = machine.handle(R.Lost(frozenset(self._answering(workers)), failed_groups, _now()))
        self._start_on = None
        while todo:
            ins = todo.pop(0)
            if isinstance(ins, R.CloseActors):
                self._close_ranks(ins.ranks)
            elif isinstance(ins, R.EndProcesses):
                self.cluster.end_processes(list(ins.workers))
            elif isinstance(ins, R.PollWorkers):
                time.sleep(0.5)
                listed = self.cluster.workers
                seen = R.WorkersSeen(tuple(listed), frozenset(self._answering(listed)), _now())
                todo.extend(machine.handle(seen))
            elif isinstance(ins, R.StartActors):
                self._start_on = list(ins.workers)
            elif isinstance(ins, R.GiveUp):
                self.groups = {}
                raise TimeoutError(ins.reason)
        self.last_recovery = machine
        self.groups = {}

    def _answering(self, addrs: list[str]) -> set[str]:
        answering = getattr(self.cluster, "answering", None)
        if answering is not None:
            answered: set[str] = answering(list(addrs))
            return answered
        with contextlib.suppress(Exception):  # a cluster object without it (tests' doubles)
            res = self.client.run(os.getpid, workers=list(addrs), on_error="return")
            return {a for a in addrs if isinstance(res.get(a), int)}
        return set()

    def _close_ranks(self, ranks: Sequence[tuple[str, int]], timeout_s: float = 10.0) -> None:
        """Close the actors of these (intact) ranks; their processes stay up."""
        with self.client.as_current():
            pending = []
            for name, r in ranks:
                g = self.groups.get(name)
                if g is not None:
                    with contextlib.suppress(Exception):
                        pending.append(g.handles[r].close())
            for p in pending:
                with contextlib.suppress(Exception):
                    p.result(timeout=timeout_s)

    def _wait_live(self, timeout_s: float) -> list[str]:
        need = max(self.compiled.num_devices, 1)
        expect = max(self.n_workers or need, need)
        live: list[str] = self.cluster.live_workers(expect, timeout_s=timeout_s, min_ok=need)
        return live

    def recreate(self, timeout_s: float = 90.0) -> None:
        """Start every actor on the workers the last :meth:`abandon` waited for (else: wait
        until the scheduler has dropped the dead worker and at least the plan's device
        count answers)."""
        workers = getattr(self, "_start_on", None)
        self._start_on = None
        self.start(workers or self._wait_live(timeout_s))
