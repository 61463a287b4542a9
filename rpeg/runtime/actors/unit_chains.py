"""Chains: consecutive execution units of one actor group issued as one call per rank.

A step of a colocated plan is a row of units on the same ranks (the sharded config: generate,
reward, ref_logprob, old_logprob, advantage, train_actor, sync_weights on devices 0-3). Issued
one by one, every unit boundary is a barrier over the group and a round trip through the flow
process (the driver issues a call to each rank, waits for all of them, records, issues the
next): measured 5-6 ms per boundary on the 2-core CI machine at 4 ranks, about 35 ms of a
0.95 s step. A chain issues such a row in one call per rank (``RankActor.run_units``); each
rank runs the units back to back and meets the others only in the collectives the stages
themselves contain. verl's single controller batches a worker group's calls the same way.

:func:`unit_chains` is pure: it decides from the scheduler's plan which units may join the
unit before them. A unit ``v`` joins the chain whose last unit is ``u`` when

* it runs on the same group at the same layout (no reshard between them) and neither
  streams (a streaming unit's chunks are consumed while it runs);
* it waits for ``u`` (so the scheduler never issues it before the chain has returned: the
  flow may run a unit inline, and a unit waiting on a chain still in flight would deadlock);
* everything it waits for is in the chain or was awaited by the chain's first unit, and it
  reads no rows from another group (nothing to pull before it runs);
* no unit of another group waits for ``u`` (it would wait for the whole chain instead).

The scheduler still sees every unit: the driver answers the later units of a chain from the
chain's results (their metrics and spans, each unit its own timeline record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rpeg.compile.step import CompiledStep, GroupSpec, TaskSpec


@dataclass(frozen=True)
class ChainUnit:
    """What :func:`unit_chains` needs of one unit of the step (in the plan's order)."""

    name: str
    group: str
    layout: tuple[int, int]  # (dp, tp) its ranks run it at
    waits: tuple[str, ...] = ()  # units of the step it waits for (the scheduler's deps)
    reads: tuple[str, ...] = ()  # units of other groups whose rows it reads (pulled first)
    streaming: bool = False


def unit_chains(units: Sequence[ChainUnit]) -> list[tuple[str, ...]]:
    """Every unit of ``units`` (topological order) in exactly one chain, chains in order;
    a unit that joins nothing is a chain of one."""
    waited_by: dict[str, set[str]] = {u.name: set() for u in units}
    by_name = {u.name: u for u in units}
    for u in units:
        for w in u.waits:
            if w in waited_by:
                waited_by[w].add(u.name)
    chains: list[list[str]] = []
    for v in units:
        if chains and _joins(v, chains[-1], by_name, waited_by):
            chains[-1].append(v.name)
        else:
            chains.append([v.name])
    return [tuple(c) for c in chains]


def _joins(
    v: ChainUnit,
    chain: list[str],
    by_name: dict[str, ChainUnit],
    waited_by: dict[str, set[str]],
) -> bool:
    head, last = by_name[chain[0]], by_name[chain[-1]]
    if (v.group, v.layout) != (head.group, head.layout) or v.streaming or head.streaming:
        return False
    if last.name not in v.waits:
        return False
    if v.reads or not set(v.waits) <= set(chain) | set(head.waits):
        return False
    return all(by_name[w].group == head.group for w in waited_by[last.name] if w != v.name)


def unit_layout(group: GroupSpec, task: TaskSpec) -> tuple[int, int]:
    """(dp, tp) the ranks of ``group`` run ``task`` at (generation: the group's gen_tp)."""
    if task.generates:
        return group.world_size // group.gen_tp, group.gen_tp
    return group.dp, group.replica_ranks


def arrives_by_take(compiled: CompiledStep, task: TaskSpec, dep: TaskSpec) -> bool:
    """Whether ``dep``'s rows reach ``task`` through the staleness buffer (an async plan's
    rollout unit feeding a train unit: ``take`` moved them), not by a pull before it runs."""
    return compiled.async_rollout and dep.phase == "rollout" and task.phase == "train"


def step_chains(compiled: CompiledStep) -> list[tuple[str, ...]]:
    """The chains of a compiled step's units that the step scheduler issues
    (:class:`rpeg.runtime.step.plan.StepPlan`; an async plan's rollout units run
    inside its rollouts and are not among them)."""
    from rpeg.runtime.step.plan import StepPlan

    units = []
    for u in StepPlan.from_compiled(compiled).units:
        t = compiled.task(u.name)
        reads = []
        for d in t.depends_on:
            dt = compiled.task(d)
            if dt.group != t.group and not arrives_by_take(compiled, t, dt):
                reads.append(d)
        lay = unit_layout(compiled.group(t.group), t)
        units.append(ChainUnit(u.name, t.group, lay, u.deps, tuple(reads), bool(t.streaming)))
    return unit_chains(units)
