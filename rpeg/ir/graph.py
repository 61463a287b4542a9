"""The RPEG IR: a data-centric graph of one RL step plus the state that crosses steps.

Pure Python (stdlib, networkx). See docs/ir.md for the model and its conventions.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import networkx as nx

from rpeg import defaults
from rpeg.errors import Problem, ProblemsError

# --------------------------------------------------------------------------- vocabulary


class StageKind(StrEnum):
    """What a stage does. The standard stage of each kind is named after the kind."""

    generate = "generate"
    reward = "reward"
    ref_logprob = "ref_logprob"
    old_logprob = "old_logprob"
    values = "values"
    advantage = "advantage"
    train_actor = "train_actor"
    train_critic = "train_critic"
    sync_weights = "sync_weights"
    env = "env"  # multi-turn: the environment's steps between the model's turns


class Role(StrEnum):
    """The model a stage runs. Rule rewards and the advantage computation use ``None``."""

    actor = "actor"
    reference = "reference"
    critic = "critic"
    reward_model = "reward_model"


class Granularity(StrEnum):
    """How a stage consumes its inputs (and hence the granularity of its in-edges)."""

    batch = "batch"
    minibatch = "minibatch"
    microbatch = "microbatch"
    sample = "sample"


#: Every data field a stage may read or write, with its meaning (documented in docs/ir.md).
FIELDS: Mapping[str, str] = {
    "prompts": "tokenized prompts (graph input)",
    "answers": "reference answers for rule rewards (graph input)",
    "responses": "generated response tokens",
    "response_mask": "mask of valid response tokens",
    "sample_logprobs": "log-probs the generation engine reported while sampling",
    "rewards": "scalar (or token-level) rewards per response",
    "ref_logprobs": "log-probs of the responses under the frozen reference model",
    "old_logprobs": "log-probs under the policy before this step's update (behaviour/proximal)",
    "values": "critic value estimates per token",
    "advantages": "advantages per token",
    "returns": "value targets (GAE returns) for the critic",
    "actor_weights": "the actor's updated weights (input of weight sync)",
    "critic_weights": "the critic's updated weights",
    "actions": "multi-turn: the model's turns (tool calls, final answer) handed to the environment",
    "observations": "multi-turn: the environment's observation tokens, input of the next turn",
}

#: Fields a graph reads from outside by default (the data set).
DEFAULT_INPUTS: tuple[str, ...] = ("prompts", "answers")

#: Roles each stage kind may use (``None`` = no model). ``values`` may use the actor when the
#: graph shares actor and critic (one trunk, value head).
KIND_ROLES: Mapping[StageKind, frozenset[Role | None]] = {
    StageKind.generate: frozenset({Role.actor}),
    StageKind.reward: frozenset({None, Role.reward_model}),
    StageKind.ref_logprob: frozenset({Role.reference}),
    StageKind.old_logprob: frozenset({Role.actor}),
    StageKind.values: frozenset({Role.critic}),
    StageKind.advantage: frozenset({None}),
    StageKind.train_actor: frozenset({Role.actor}),
    StageKind.train_critic: frozenset({Role.critic}),
    StageKind.sync_weights: frozenset({Role.actor}),
    StageKind.env: frozenset({None}),
}

#: The state carrying policy weights from the trainer to generation; its staleness is the
#: bounded-asynchrony k of the graph.
WEIGHTS_STATE = "weights"

LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")

Scalar = bool | int | float | str | None


class GraphError(ProblemsError):
    """A graph (or a request to build or transform one) with one or more problems."""

    title = "invalid graph"


# --------------------------------------------------------------------------- params


class Params(Mapping[str, Any]):
    """Immutable, hashable mapping of algorithm parameters (scalar values only)."""

    __slots__ = ("_d", "_items")

    def __init__(self, data: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None, **kw):
        d = dict(data or {})
        d.update(kw)
        bad = [
            Problem(f"params.{k}", f"value must be a scalar (bool/int/float/str/null), got {v!r}")
            for k, v in d.items()
            if not isinstance(v, bool | int | float | str | type(None))
        ]
        bad += [
            Problem("params", f"key {k!r} must be a string") for k in d if not isinstance(k, str)
        ]
        if bad:
            raise GraphError(bad)
        self._d = d
        self._items = tuple(sorted(d.items()))

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._d) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Params({dict(self._items)!r})"

    def replace(self, **kw: Any) -> Params:
        """A copy with ``kw`` set."""
        return Params({**self._d, **kw})


# --------------------------------------------------------------------------- elements


def _tuple(x: Iterable[str] | str) -> tuple[str, ...]:
    return (x,) if isinstance(x, str) else tuple(x)


@dataclass(frozen=True)
class Stage:
    """One step of the RL iteration: runs ``role``'s model, reads and writes data fields."""

    name: str
    kind: StageKind
    role: Role | None
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    granularity: Granularity = Granularity.batch

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StageKind(self.kind))
        object.__setattr__(self, "role", None if self.role is None else Role(self.role))
        object.__setattr__(self, "reads", _tuple(self.reads))
        object.__setattr__(self, "writes", _tuple(self.writes))
        object.__setattr__(self, "granularity", Granularity(self.granularity))


@dataclass(frozen=True)
class Edge:
    """A data edge within a step, derived from fields: ``src`` writes ``field``, ``dst`` reads it.

    ``next_turn``: an env stage's output read by a generate stage (multi-turn): it feeds the
    *next* turn of the same rollout, so it closes the generate <-> env loop inside one
    execution unit and is no dependency between stages (:meth:`Graph.dag` leaves it out)."""

    src: str
    dst: str
    field: str
    granularity: Granularity = Granularity.batch
    next_turn: bool = False


@dataclass(frozen=True)
class StateEdge:
    """State crossing steps: ``state`` made by ``src`` at step t is used by ``dst`` at t+1+k."""

    src: str
    dst: str
    state: str = WEIGHTS_STATE
    staleness: int = defaults.MAX_STALENESS


@dataclass(frozen=True)
class FusedGroup:
    """Stages that run back to back in one process (in this order); ``streaming`` = generate
    hands samples to the next stage as they finish instead of a whole batch."""

    name: str
    stages: tuple[str, ...]
    streaming: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", _tuple(self.stages))


ExecutionUnit = FusedGroup | Stage


# --------------------------------------------------------------------------- graph


@dataclass(frozen=True)
class Graph:
    """A whole RL step. Immutable and hashable; transforms return new graphs.

    Data plus lookups only: checking is :func:`rpeg.ir.checks.validate` / ``problems`` and the
    YAML form is :mod:`rpeg.ir.serialize`, both functions of a graph (so this module imports
    neither and no import cycle forms)."""

    name: str
    algorithm: str
    stages: tuple[Stage, ...]
    state_edges: tuple[StateEdge, ...] = ()
    fused: tuple[FusedGroup, ...] = ()
    colocated: tuple[frozenset[Role], ...] = ()
    shared_actor_critic: bool = False
    params: Params = field(default_factory=Params)
    inputs: tuple[str, ...] = DEFAULT_INPUTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "state_edges", tuple(self.state_edges))
        object.__setattr__(self, "fused", tuple(self.fused))
        object.__setattr__(
            self, "colocated", tuple(frozenset(Role(r) for r in s) for s in self.colocated)
        )
        if not isinstance(self.params, Params):
            object.__setattr__(self, "params", Params(self.params))
        object.__setattr__(self, "inputs", _tuple(self.inputs))

    # ---------------------------------------------------------------- lookups
    @functools.cached_property
    def _by_name(self) -> dict[str, Stage]:
        return {s.name: s for s in self.stages}

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {s.name: i for i, s in reversed(list(enumerate(self.stages)))}

    def stage(self, name: str) -> Stage:
        """The stage called ``name`` (GraphError listing the known stages otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(s.name for s in self.stages) or "none"
            raise GraphError(
                [Problem(f"stage {name!r}", f"no such stage; known stages: {known}")]
            ) from None

    def has_stage(self, name: str) -> bool:
        return name in self._by_name

    def stages_of_kind(self, kind: StageKind | str) -> tuple[Stage, ...]:
        kind = StageKind(kind)
        return tuple(s for s in self.stages if s.kind == kind)

    @functools.cached_property
    def producers(self) -> dict[str, str]:
        """field -> the (first) stage that writes it."""
        out: dict[str, str] = {}
        for s in self.stages:
            for f in s.writes:
                out.setdefault(f, s.name)
        return out

    @functools.cached_property
    def edges(self) -> tuple[Edge, ...]:
        """Data edges derived from fields, in consumer order then read order."""
        out = []
        for s in self.stages:
            for f in s.reads:
                src = self.producers.get(f)
                if src is None or src == s.name:
                    continue
                gran = s.granularity
                grp = self.group_of(s.name)
                if grp is not None and grp.streaming and src in grp.stages:
                    gran = Granularity.sample
                turn = s.kind == StageKind.generate and self._by_name[src].kind == StageKind.env
                out.append(Edge(src, s.name, f, Granularity.sample if turn else gran, turn))
        return tuple(out)

    @functools.cached_property
    def env_stages(self) -> tuple[Stage, ...]:
        """The env stages (multi-turn rollouts); empty for a single-turn graph."""
        return self.stages_of_kind(StageKind.env)

    @functools.cached_property
    def roles(self) -> frozenset[Role]:
        """Model roles used by some stage."""
        return frozenset(s.role for s in self.stages if s.role is not None)

    @functools.cached_property
    def staleness(self) -> int:
        """Bounded asynchrony k of the weights state edge(s); 0 = on-policy."""
        ks = [e.staleness for e in self.state_edges if e.state == WEIGHTS_STATE]
        return max(ks) if ks else 0

    def group_of(self, stage_name: str) -> FusedGroup | None:
        """The fused group that contains ``stage_name``, or None."""
        for g in self.fused:
            if stage_name in g.stages:
                return g
        return None

    def group(self, name: str) -> FusedGroup:
        for g in self.fused:
            if g.name == name:
                return g
        known = ", ".join(g.name for g in self.fused) or "none"
        raise GraphError([Problem(f"fused group {name!r}", f"no such group; known: {known}")])

    def colocated_with(self, role: Role | str) -> frozenset[Role]:
        """Roles that time-share devices with ``role`` (including itself)."""
        role = Role(role)
        for s in self.colocated:
            if role in s:
                return s
        return frozenset({role})

    def dag(self) -> nx.DiGraph:
        """networkx DiGraph of stages (nodes carry ``stage``) and data edges (``fields``);
        without the next-turn edges (env -> generate), which loop within a rollout."""
        d = nx.DiGraph()
        for s in self.stages:
            d.add_node(s.name, stage=s)
        for e in self.edges:
            if e.next_turn:
                continue
            if d.has_edge(e.src, e.dst):
                d[e.src][e.dst]["fields"].append(e.field)
            else:
                d.add_edge(e.src, e.dst, fields=[e.field], granularity=e.granularity)
        return d

    # ---------------------------------------------------------------- ordering
    @functools.cached_property
    def _units(self) -> tuple[ExecutionUnit, ...]:
        node_of: dict[str, tuple[str, str]] = {}
        for g in self.fused:
            for s in g.stages:
                node_of.setdefault(s, ("g", g.name))
        c = nx.DiGraph()
        key: dict[tuple[str, str], int] = {}
        for s in self.stages:
            n = node_of.get(s.name, ("s", s.name))
            c.add_node(n)
            key[n] = min(key.get(n, 10**9), self._index[s.name])
        for e in self.edges:
            if e.next_turn:  # the generate <-> env loop of one rollout unit
                continue
            a = node_of.get(e.src, ("s", e.src))
            b = node_of.get(e.dst, ("s", e.dst))
            if a != b:
                c.add_edge(a, b)
        try:
            order = list(nx.lexicographical_topological_sort(c, key=lambda n: key[n]))
        except nx.NetworkXUnfeasible:
            cyc = nx.find_cycle(c)  # [(unit, unit), ...]; a unit is (kind, name)
            path = " -> ".join([cyc[0][0][1], *(v[1] for _, v in cyc)])
            raise GraphError(
                [Problem("graph", f"execution units form a cycle within a step: {path}")]
            ) from None
        groups = {g.name: g for g in self.fused}
        return tuple(groups[n] if t == "g" else self._by_name[n] for t, n in order)

    def execution_units(self) -> list[ExecutionUnit]:
        """Fused groups and lone stages in a topological order (what gets scheduled)."""
        return list(self._units)

    def topological_order(self) -> list[str]:
        """Stage names in a topological order that keeps each fused group contiguous."""
        out: list[str] = []
        for u in self._units:
            out.extend(u.stages if isinstance(u, FusedGroup) else (u.name,))
        return out

    def replace(self, **changes: Any) -> Graph:
        """A copy with ``changes`` (not validated)."""
        import dataclasses

        return dataclasses.replace(self, **changes)
