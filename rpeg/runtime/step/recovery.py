"""What to do with a run's workers after one is lost: a state machine without I/O.

Events in, instructions out (the style of dask/distributed's ``worker_state_machine``): the
caller (:class:`rpeg.runtime.actors.lifecycle.ActorSet`) observes the cluster, feeds what
it saw as an event and executes the instructions; the machine decides, and is tested on its
own (``tests/runtime/actors/test_recovery_machine.py``).

The rules:

* A rank is **broken** when its worker is lost (it does not answer), when its group's
  collective failed (``failed_groups``; when no worker is missing and no group is named,
  every rank in a collective is suspect: a collective timed out somewhere), or when it
  shares a process group (a *collective*: a data-parallel group, the weight-sync group) with a broken
  rank -- transitively: a rank blocked in an all-reduce with a dead peer cannot be told to
  leave it, and once its process is replaced every other member of its collectives has a
  dead peer too.
* The workers of broken ranks that still answer are **ended** (``EndProcesses``: the
  process exits at once, ``os._exit``; its nanny starts a fresh one under the same name,
  exactly as for the lost worker). Dask's graceful ``restart_workers`` is not used: a worker
  whose actor thread is blocked in a gloo collective never finishes closing, the scheduler
  then removes it, and with distributed 2026.8 it did not come back (issue 28: "1 of 1
  listed workers answer, 4 expected" after 90 s at k=1).
* Every other survivor is **kept**: its process stays up, only its actors are closed
  (``CloseActors``) before every actor is started again.
* Processes are ended only after the lost worker's replacement has registered (the ordering
  measured in docs/runtime.md "Faults": a restart issued while the scheduler still waits for
  the lost worker lost both).
* The machine waits (``PollWorkers``) until every listed worker answers and the original
  count is back, then says ``StartActors`` on the answering workers. Past ``deadline_s`` it
  proceeds with what answers when that is at least the plan's device count, else
  ``GiveUp`` naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep

Rank = tuple[str, int]  # (group name, rank)


# ------------------------------------------------------------------------------ events
@dataclass(frozen=True)
class Lost:
    """A call failed with a lost worker. ``answering``: the workers of the placement that
    answered a ping right after; ``failed_groups``: groups whose collective broke (a
    timed-out or reset collective breaks the group even when every process answers)."""

    answering: frozenset[str]
    failed_groups: frozenset[str] = frozenset()
    now: float = 0.0


@dataclass(frozen=True)
class WorkersSeen:
    """The scheduler's list of workers and those of them that answered a ping."""

    listed: tuple[str, ...]
    answering: frozenset[str]
    now: float


# ------------------------------------------------------------------------------ instructions
@dataclass(frozen=True)
class CloseActors:
    """Close the actors of these intact ranks (their processes stay up)."""

    ranks: tuple[Rank, ...]


@dataclass(frozen=True)
class EndProcesses:
    """End these workers' processes at once (their nannies start fresh ones)."""

    workers: tuple[str, ...]


@dataclass(frozen=True)
class PollWorkers:
    """Look at the cluster again (after a short sleep) and report ``WorkersSeen``."""


@dataclass(frozen=True)
class StartActors:
    """Start every actor on these workers (sorted as the scheduler lists them)."""

    workers: tuple[str, ...]


@dataclass(frozen=True)
class GiveUp:
    reason: str


# ------------------------------------------------------------------------------ topology
@dataclass(frozen=True)
class Topology:
    """Where the ranks are and which of them share a process group."""

    placement: dict[Rank, str]  # (group, rank) -> worker address
    collectives: tuple[frozenset[Rank], ...]

    def broken(self, lost_workers: set[str], failed_groups: frozenset[str]) -> set[Rank]:
        """Ranks on lost workers or in failed groups, closed over shared collectives."""
        out = {r for r, w in self.placement.items() if w in lost_workers or r[0] in failed_groups}
        changed = True
        while changed:
            changed = False
            for members in self.collectives:
                if members & out and not members <= out:
                    out |= members
                    changed = True
        return out


def topology_of(compiled: CompiledStep, placement: dict[Rank, str]) -> Topology:
    """A compiled step's collectives: each group of more than one rank, and the bucketed
    weight-sync group (the source group's rank 0 and every rank of the targets)."""
    coll: list[frozenset[Rank]] = []
    for g in compiled.actor_groups:
        if g.world_size > 1:
            coll.append(frozenset((g.name, r) for r in range(g.world_size)))
    ws = compiled.weight_sync
    if ws.copies:
        members = {(ws.source, 0)}
        for t in ws.targets:
            members |= {(t, r) for r in range(compiled.group(t).world_size)}
        coll.append(frozenset(members))
    return Topology(placement=dict(placement), collectives=tuple(coll))


# ------------------------------------------------------------------------------ machine
@dataclass
class Recovery:
    """One recovery (module doc). ``expect``: workers the cluster had; ``need``: the fewest
    the plan can run on; ``deadline_s``: how long to wait for the full count."""

    topology: Topology
    expect: int
    need: int
    deadline_s: float = 90.0
    phase: str = "new"  # new replacing ending starting done failed
    lost: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    broken: set[Rank] = field(default_factory=set)
    started_at: float = 0.0

    def handle(self, ev: Lost | WorkersSeen) -> list[object]:
        if isinstance(ev, Lost):
            return self._lost(ev)
        if self.phase == "replacing":
            return self._replacing(ev)
        if self.phase == "ending":
            return self._ending(ev)
        raise RuntimeError(f"recovery: {type(ev).__name__} while {self.phase}")

    def _lost(self, ev: Lost) -> list[object]:
        if self.phase != "new":
            raise RuntimeError(f"recovery: Lost while {self.phase}")
        self.started_at = ev.now
        workers = set(self.topology.placement.values())
        self.lost = workers - set(ev.answering)
        failed = ev.failed_groups
        if not self.lost and not failed:  # no one missing, no group named: all suspect
            failed = frozenset(g for members in self.topology.collectives for g, _r in members)
        self.broken = self.topology.broken(self.lost, failed)
        stuck = {self.topology.placement[r] for r in self.broken} - self.lost
        self.ended = stuck
        intact = tuple(
            sorted(r for r, w in self.topology.placement.items() if w not in stuck | self.lost)
        )
        out: list[object] = [CloseActors(intact)] if intact else []
        self.phase = "replacing" if self.lost else "ending"
        if not self.lost and stuck:
            out.append(EndProcesses(tuple(sorted(stuck))))
        out.append(PollWorkers())
        return out

    def _back(self, ev: WorkersSeen, gone: set[str]) -> bool:
        """No address of ``gone`` listed, every listed worker answers, the count is back."""
        listed = set(ev.listed)
        return not (listed & gone) and listed == set(ev.answering) and len(listed) >= self.expect

    def _timed_out(self, ev: WorkersSeen) -> bool:
        return ev.now - self.started_at > self.deadline_s

    def _replacing(self, ev: WorkersSeen) -> list[object]:
        # the lost worker's replacement registers under a new address; the stuck survivors
        # are still listed (and answer: their event loop runs, only the actor thread waits)
        if self._back(ev, self.lost) or self._timed_out(ev):
            self.phase = "ending"
            if self.ended:  # their own deadline from here
                self.started_at = ev.now
                return [EndProcesses(tuple(sorted(self.ended))), PollWorkers()]
            return self._ending(ev)
        return [PollWorkers()]

    def _ending(self, ev: WorkersSeen) -> list[object]:
        gone = self.lost | self.ended
        if self._back(ev, gone):
            self.phase = "starting"
            return [StartActors(tuple(ev.listed))]
        if not self._timed_out(ev):
            return [PollWorkers()]
        ok = [a for a in ev.listed if a in ev.answering and a not in gone]
        if len(ok) >= self.need:
            self.phase = "starting"
            return [StartActors(tuple(ok))]
        self.phase = "failed"
        return [
            GiveUp(
                f"cluster not healthy after {self.deadline_s:.0f}s: {len(ok)} of "
                f"{len(ev.listed)} listed workers answer, {self.expect} expected, the plan "
                f"needs {self.need}; lost {sorted(self.lost)}, ended {sorted(self.ended)} "
                "(their nannies did not start them again)"
            )
        ]
