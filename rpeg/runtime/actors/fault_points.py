"""Deterministic fault injection: a rank process ends itself (``os._exit``) at a named
phase of a named step, so that the recovery of a lost worker is tested at an exact point of
the run instead of after some wall-clock time.

Set ``RPEG_FAULT_AT`` in the environment the Dask workers start from (a LocalCluster's
nannies pass the parent's environment on to every worker process they spawn)::

    RPEG_FAULT_AT="group=trainer rank=1 phase=train step=2 once=/tmp/x/fired"

* ``group``/``rank``: the rank that dies (a group name of the compiled step; ``*`` any).
* ``phase``: ``generate`` (at the start of a unit that generates), ``train`` (at the
  start of a unit that trains: its data-parallel peers then wait in the gradient
  all-reduce for a rank that never comes), ``sync`` (a trainer rank about to broadcast, or
  a generator rank about to receive, the weights), ``checkpoint`` (a rank asked for its
  state: the checkpoint of that step is never committed), ``env`` (a rank generating a
  multi-turn rollout, as the environment steps of turn ``turn`` begin: its samples are
  half-finished, that turn generated and the earlier turns' observations appended).
* ``step``: for ``generate``/``train``/``env`` the unit's step; for ``sync``/``checkpoint``
  the rank's policy version at that moment (the number of updates applied so far).
* ``turn``: only with ``phase=env`` (and required there): the model turn, from 1.
* ``once``: a file created (exclusively) just before the process ends; while it exists the
  point does not fire again -- the replacement process (same environment) survives.

An ``env`` point matches the generating unit the process runs: :func:`fault_point` keeps
the group, rank and step of the last one that started (phase ``generate``), and
:func:`env_turn` -- called by the multi-turn rollout (rpeg.runtime.envs.rollout) -- checks
them with the turn.

Nothing fires without the variable, and the variable is read only where tests enable fault
injection: ``RPEG_TEST_FAULTS=1`` beside it (:func:`arm` sets both), so a production run with
a stray ``RPEG_FAULT_AT`` in its environment never ends itself (issue 44). The preflight
checks an enabled point's syntax before anything starts (:func:`fault_problems`) and warns
about a disabled one. The check is one ``os.environ`` lookup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "RPEG_FAULT_AT"
#: the variable that enables fault injection (``1``); without it ``RPEG_FAULT_AT`` is ignored
ENABLE = "RPEG_TEST_FAULTS"
PHASES = ("generate", "train", "sync", "checkpoint", "env")
EXIT_CODE = 137  # what a kill -9 leaves (128 + SIGKILL)


@dataclass(frozen=True)
class FaultPoint:
    group: str
    rank: int | None  # None: any rank
    phase: str
    step: int
    once: str
    turn: int | None = None  # phase env only: the model turn whose environment steps end it

    @classmethod
    def parse(cls, text: str) -> FaultPoint:
        """``key=value`` pairs separated by spaces (module doc); a clear ValueError naming
        the key for anything else."""
        kv: dict[str, str] = {}
        for part in text.split():
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"{ENV}: {part!r} is not key=value")
            kv[key] = value
        required = {"group", "rank", "phase", "step", "once"}
        allowed = required | {"turn"}
        unknown = set(kv) - allowed
        if unknown:
            raise ValueError(f"{ENV}: unknown key(s) {sorted(unknown)}; allowed {sorted(allowed)}")
        missing = required - set(kv)
        if missing:
            raise ValueError(f"{ENV}: missing {sorted(missing)}")
        if kv["phase"] not in PHASES:
            raise ValueError(f"{ENV}: phase {kv['phase']!r}; allowed: {', '.join(PHASES)}")
        if (kv["phase"] == "env") != ("turn" in kv):
            raise ValueError(f"{ENV}: turn=T goes with phase=env, and only there")
        turn = int(kv["turn"]) if "turn" in kv else None
        if turn is not None and turn < 1:
            raise ValueError(f"{ENV}: turn must be >= 1 (got {turn})")
        return cls(
            group=kv["group"],
            rank=None if kv["rank"] == "*" else int(kv["rank"]),
            phase=kv["phase"],
            step=int(kv["step"]),
            once=kv["once"],
            turn=turn,
        )

    def format(self) -> str:
        rank = "*" if self.rank is None else str(self.rank)
        turn = "" if self.turn is None else f" turn={self.turn}"
        return (
            f"group={self.group} rank={rank} phase={self.phase} step={self.step}{turn} "
            f"once={self.once}"
        )

    def matches(
        self, group: str, rank: int, phase: str, step: int, turn: int | None = None
    ) -> bool:
        return (
            phase == self.phase
            and step == self.step
            and turn == self.turn
            and self.group in ("*", group)
            and (self.rank is None or self.rank == rank)
        )


#: (group, rank, step) of the generating unit this process runs: what an env point matches
_GENERATING: list[tuple[str, int, int]] = []


def fault_point(group: str, rank: int, phase: str, step: int, turn: int | None = None) -> None:
    """End this process (exit code 137, as a ``kill -9``) if ``RPEG_FAULT_AT`` names this
    point and its ``once`` file does not exist yet (it is created first)."""
    if phase == "generate":
        _GENERATING[:] = [(group, rank, step)]
    text = armed()
    if not text:
        return
    point = FaultPoint.parse(text)
    if not point.matches(group, rank, phase, step, turn):
        return
    try:
        fd = os.open(point.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{group} {rank} {phase} {step} {turn} pid={os.getpid()}\n".encode())
    os.close(fd)
    os._exit(EXIT_CODE)


def env_turn(turn: int) -> None:
    """A multi-turn rollout's environment steps of model turn ``turn`` (from 1) begin: the
    ``env`` fault point of the generating unit this process runs (nothing outside a rank's
    unit, e.g. in the single-process trainer)."""
    if _GENERATING and armed():
        group, rank, step = _GENERATING[0]
        fault_point(group, rank, "env", step, turn)


def armed() -> str | None:
    """``RPEG_FAULT_AT``'s text where fault injection is enabled (``RPEG_TEST_FAULTS=1``),
    else None."""
    if os.environ.get(ENABLE) != "1":
        return None
    return os.environ.get(ENV) or None


def fault_problems() -> tuple[list[tuple[str, str]], list[str]]:
    """Before a run starts: (problems as (where, what), warnings) of this environment's
    fault point -- a malformed enabled one is a problem; a set but disabled one a warning."""
    text = os.environ.get(ENV)
    if not text:
        return [], []
    if os.environ.get(ENABLE) != "1":
        return [], [f"{ENV} is set but ignored: fault injection is a test hook ({ENABLE}=1)"]
    try:
        FaultPoint.parse(text)
    except ValueError as exc:
        return [(ENV, str(exc))], []
    return [], []


def arm(spec: str | None) -> None:
    """Set (``spec``) or clear (None) ``RPEG_FAULT_AT`` -- and ``RPEG_TEST_FAULTS`` -- in this
    process: what a test runs on every running worker (``client.run(arm, spec)``;
    ``os.environ.__setitem__`` would be pickled with a copy of the caller's environment and
    set that copy)."""
    if spec is None:
        os.environ.pop(ENV, None)
        os.environ.pop(ENABLE, None)
    else:
        os.environ[ENV] = spec
        os.environ[ENABLE] = "1"
