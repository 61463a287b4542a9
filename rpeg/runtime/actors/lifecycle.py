"""The lifecycle of a run's actors: start (placement, process groups), close, and the two
halves of a recovery (abandon the survivors, re-create every actor on live workers).

One ``RankActor`` per rank, placed on the worker of its device (device i -> the i-th
worker sorted by name); a group of several ranks joins a torch.distributed process group
(every rank issued before waiting).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from rpeg.runtime.actors.proxies import ByteCounter, RankGroup


class ActorSet:
    """The actors of a compiled step on a cluster (``rpeg.infra.cluster`` object)."""

    def __init__(
        self,
        config: Any,
        compiled: Any,
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

    def group(self, name: str) -> RankGroup:
        return self.groups[name]

    def handles(self) -> dict[str, list[Any]]:
        """Raw actor handles per group (for code that calls actors directly)."""
        return {n: g.handles for n, g in self.groups.items()}

    # ---------------------------------------------------------------- start / close
    def start(self, workers: Sequence[str] | None = None) -> None:
        """One actor per rank, then each group's process group. ``workers``: live worker
        addresses sorted by name (default: the scheduler's list)."""
        from rpeg.runtime.actors.rank import RankActor

        cy = self.config.to_yaml()
        workers = list(workers) if workers else self.listed_workers()
        if self.n_workers is None:
            self.n_workers = len(workers)
        k = int(self.compiled.buffer["max_staleness"])
        t0 = time.perf_counter()
        self.placement = {
            (g.name, rank): workers[dev % len(workers)]
            for g in self.compiled.actor_groups
            for rank, dev in enumerate(g.devices)
        }
        slots = self._cpu_slots()
        with self.client.as_current():
            futs = {}
            for g in self.compiled.actor_groups:
                gd = {**g.to_dict(), "max_staleness": k, "collective_timeout_s": timeout_s}
                for rank in range(g.world_size):
        gpus = self._gpu_slots()
        from rpeg.runtime.actors.predicted import collective_timeout_s

        timeout_s = collective_timeout_s(self.config)  # the groups' (rpeg.runtime.actors.predicted)
                    addr = self.placement[(g.name, rank)]
                    futs[(g.name, rank)] = self.client.submit(
                        RankActor,
                        cy,
                        gd,
                        rank,
                        self.async_rollout,
                        cpu_slot=slots.get(addr),
                        actor=True,
                        workers=[addr],
                        allow_other_workers=False,
                        pure=False,
                    )
                        gpu_slot=gpus.get(addr),
            self.groups = {
                g.name: RankGroup(
                    self.client,
                    g.name,
                    [futs[(g.name, r)].result() for r in range(g.world_size)],
                    self.count_bytes,
                )
                for g in self.compiled.actor_groups
            }
        for g in self.groups.values():
            g.join_process_group()
        self.start_s = time.perf_counter() - t0

    def listed_workers(self, timeout_s: float = 90.0) -> list[str]:
        """The scheduler's workers; while it lists none (a cluster whose workers are still
        starting, or restarting after a previous run's recovery), wait up to ``timeout_s``
        for them instead of placing ranks on nothing."""
        workers = self.cluster.workers
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

    def close(self, timeout_s: float = 30.0) -> None:
        """Tear down every rank's process group and drop the handles."""
        for g in self.groups.values():
            g.close(timeout_s)
        self.groups = {}
    def _gpu_slots(self) -> dict[str, int]:
        """Each used worker's own GPU (a local CUDA index) from what the workers see
        (rpeg.runtime.actors.rendezvous.gpu_slots); {} when no group runs on CUDA."""
        if not any(g.device_type == "cuda" for g in self.compiled.actor_groups):
            return {}
        from rpeg.runtime.actors.rendezvous import gpu_slots, worker_gpus

        used = list(dict.fromkeys(self.placement.values()))
        views = self.client.run(worker_gpus, workers=used)
        return gpu_slots({a: views[a] for a in used})


    # ---------------------------------------------------------------- recovery
    def collective_workers(self) -> set[str]:
        """Workers of ranks that share a collective with another process: a data-parallel
        group, or a member of a bucketed weight-sync group."""
        ws = self.compiled.weight_sync
        sync = (
            set(ws.get("targets") or []) | {ws.get("source")} if ws["mode"] == "bucketed" else set()
        )
        return {
            addr
            for (g, _r), addr in self.placement.items()
            if self.compiled.group(g).world_size > 1 or g in sync
        }

    def abandon(self, timeout_s: float = 90.0) -> None:
        """After a lost worker: a surviving rank may sit in a collective with the dead peer
        (its one actor thread blocked until the collective's timeout), so the processes of
        such ranks are restarted (nanny); the other survivors are closed.

        The replacement of the lost worker is awaited first: a ``restart_workers`` issued
        while the scheduler still waits for it loses both (measured with distributed
        2026.8: kill one of two workers, restart the other at once, and neither is back
        after 60 s; with the wait in between both are back in ~3.5 s)."""
        stuck = self.collective_workers()
        if stuck:
            with contextlib.suppress(Exception):
                self._wait_live(timeout_s)
            stuck &= set(self.cluster.workers)  # the lost one is gone (new address)
            if stuck:
                with contextlib.suppress(Exception):
                    self.client.restart_workers(sorted(stuck), timeout=60)
        else:
            self.close(timeout_s=10.0)
        self.groups = {}

    def _wait_live(self, timeout_s: float) -> list[str]:
        need = max(self.compiled.num_devices, 1)
        expect = max(self.n_workers or need, need)
        return self.cluster.live_workers(expect, timeout_s=timeout_s, min_ok=need)

    def recreate(self, timeout_s: float = 90.0) -> None:
        """Wait until the scheduler has dropped the dead worker and the replacement answers
        (at least the plan's device count), then start every actor on the live workers."""
        self.start(self._wait_live(timeout_s))
