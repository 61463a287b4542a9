"""The optimizer's search space (pure): structure x placement x per-unit layouts.

A candidate plan is three nested choices (docs/optimizer.md):

1. **Structure** (:class:`Structure`): the staleness bound k (0..max), actor-critic sharing
   (PPO), and fusion (none / ``rollout`` = generate+reward streaming / ``forward`` = the
   forward-only log-prob passes / both). Each structure is one IR graph.
2. **Placement** (:class:`Placement`): colocated (every unit time-shares all devices) or
   disaggregated (generation on the first ``gen_devices``, everything else on the rest). The
   split falls on node boundaries, so no node is shared by the two pools. Plus the plan-level
   switches that only make sense there: offload when roles time-share devices, partial
   rollout (k >= 1, disaggregated) and streaming (k = 0, disaggregated).
3. **Layout** (:class:`Layout`) per execution unit: tp / pp / cp / ep, micro-batch size,
   recompute and engine. tp (and cp) groups stay inside a node (tp*cp divides the node's
   GPUs), pp divides the model's layers, tp divides the attention heads, dp is derived.

Raw layout grids are filtered here; every rejected point is counted by reason
(``divisibility`` or ``devices``) in :class:`Counts`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from rpeg import defaults
from rpeg.ir import Graph, GraphError, bound_async, fuse, share_actor_critic
from rpeg.perf.eager_cpu import is_cpu
from rpeg.plan.schema import trains_fsdp

GEN_KINDS = frozenset({"generate"})
POOL_GEN_KINDS = frozenset({"generate", "reward"})
TRAIN_KINDS = frozenset({"train_actor", "train_critic"})
FWD_KINDS = frozenset({"ref_logprob", "old_logprob", "values"})
FUSIONS = ("none", "rollout", "forward", "rollout+forward")
#: parallel degrees the runtime cannot run yet, with the reason: ``rpeg.compile`` refuses them
#: and the space drops them (``SpaceOptions.runtime_only``) under a named ``runtime:`` reason
UNSUPPORTED_DEGREES: dict[str, str] = {}


@dataclass(frozen=True)
class Layout:
    """Execution settings of one unit (devices come from the placement)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch_size: int = defaults.UNIT_MICRO_BATCH_SIZE
    recompute: bool = True
    engine: str = "auto"
    gpu_memory_utilization: float = defaults.SEARCH_GPU_MEMORY_UTILIZATION

    def describe(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        return "x".join(parts)


@dataclass(frozen=True)
class Structure:
    """Graph-level choices; :meth:`graph` applies them to the base graph."""

    staleness: int  # this candidate's bound k (the space ranges over 0..max_staleness)
    share_actor_critic: bool = False
    fusion: str = "none"

    @property
    def fused(self) -> bool:
        return self.fusion != "none"

    def describe(self) -> str:
        s = f"k={self.staleness}"
        if self.share_actor_critic:
            s += ", shared actor-critic"
        if self.fusion != "none":
            s += f", fused {self.fusion}"
        return s

    def graph(self, base: Graph) -> Graph:
        """The transformed graph; raises GraphError when the combination makes no sense."""
        g = base
        if self.share_actor_critic:
            g = share_actor_critic(g)
        if "rollout" in self.fusion:
            g = fuse(g, ["generate", "reward"], streaming=True, name="rollout")
        if "forward" in self.fusion:
            order = g.topological_order()
            fwd = [s for s in order if _kind(g.stage(s)) in FWD_KINDS]
            if len(fwd) < 2:
                raise GraphError([])
            g = fuse(g, fwd, name="forward")
        if g.staleness != self.staleness:
            g = bound_async(g, self.staleness)
        return g


@lru_cache(maxsize=256)
def _pools(n: int, gen: int) -> dict[str, tuple[int, ...]]:
    """The device pools of a placement (cached: the search asks for them per cell, and a
    pool of 100k devices is a 100k-tuple). Callers must not mutate the result."""
    if gen == 0:
        return {"all": tuple(range(n))}
    return {"gen": tuple(range(gen)), "train": tuple(range(gen, n))}


@dataclass(frozen=True)
class Placement:
    """Where units run. ``gen_devices`` = 0 means colocated on ``num_devices``."""

    num_devices: int
    gen_devices: int = 0
    offload: bool = False
    partial_rollout: bool = False
    streaming: bool = False

    @property
    def colocated(self) -> bool:
        return self.gen_devices == 0

    @property
    def train_devices(self) -> int:
        return self.num_devices - self.gen_devices

    def pools(self) -> dict[str, tuple[int, ...]]:
        return _pools(self.num_devices, self.gen_devices)

    def describe(self) -> str:
        if self.colocated:
            s = f"colocated on {self.num_devices}"
        else:
            s = f"disaggregated {self.gen_devices} gen + {self.train_devices} train"
        flags = [
            n
            for n, v in (
                ("offload", self.offload),
                ("partial rollout", self.partial_rollout),
                ("streaming", self.streaming),
            )
            if v
        ]
        return s + (f" ({', '.join(flags)})" if flags else "")


@dataclass
class Counts:
    """How many candidates were generated, evaluated, and rejected (by reason)."""

    structures: int = 0
    placements: int = 0
    layouts: int = 0
    evaluated: int = 0
    pruned: int = 0  # cells whose lower bound could not beat the incumbents
    infeasible: Counter = field(default_factory=Counter)

    def reject(self, reason: str, n: int = 1) -> None:
        self.infeasible[reason] += n

    def to_dict(self) -> dict[str, Any]:
        return {
            "structures": self.structures,
            "placements": self.placements,
            "layouts": self.layouts,
            "evaluated": self.evaluated,
            "pruned_by_bound": self.pruned,
            "infeasible": dict(sorted(self.infeasible.items())),
        }


@dataclass(frozen=True)
class SpaceOptions:
    """Knobs of the space (all have defaults; ``search`` config section overrides)."""

    max_staleness: int = defaults.MAX_STALENESS  # the largest k the space tries
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8)
    cp: tuple[int, ...] = (1, 2)
    cp_min_seq_tokens: int = 8192
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[bool, ...] = (True, False)
    engines: tuple[str, ...] = ("auto", "fsdp")
    gen_pp: tuple[int, ...] = (1, 2)
    gen_memory_utilization: tuple[float, ...] = (defaults.SEARCH_GPU_MEMORY_UTILIZATION,)
    fusions: tuple[str, ...] = FUSIONS
    share: tuple[bool, ...] = (False, True)
    colocated: bool = True
    disaggregated: bool = True
    offload: tuple[bool, ...] = (True, False)
    # partial rollout (AReaL's interruptible rollout) is priced for published systems only:
    # RPEG's runtime refuses it (rpeg.compile.checks.PARTIAL_ROLLOUT_REFUSED), so the planner
    # searches without it; the areal baseline keeps it as a comparison of systems
    partial_rollout: tuple[bool, ...] = (False,)
    streaming: tuple[bool, ...] = (False, True)
    # device split: exact when the node count is at most this, coarse-to-fine otherwise
    exhaustive_splits: int = 16
    # drop layouts the runtime refuses (pp/cp/ep > 1: rpeg.compile.UNSUPPORTED_DEGREES), each
    # counted under a named ``runtime: ...`` reason, so the planner never emits a plan that
    # ``rpeg train`` refuses
    runtime_only: bool = True

    def restrict(self, **changes: Any) -> SpaceOptions:
        return replace(self, **changes)


def _kind(stage: Any) -> str:
    k = stage.kind
    return getattr(k, "value", str(k))


def unit_kinds(graph: Graph) -> list[tuple[str, frozenset[str], tuple[tuple[str, str], ...]]]:
    """[(unit name, kinds, ((kind, role), ...))] in execution order."""
    out = []
    for u in graph.execution_units():
        members = getattr(u, "stages", None)
        stages = [graph.stage(m) if isinstance(m, str) else m for m in members] if members else [u]
        sig = tuple((_kind(s), getattr(s.role, "value", str(s.role))) for s in stages)
        out.append((u.name, frozenset(k for k, _ in sig), sig))
    return out


def layout_class(kinds: frozenset[str], sig: tuple[tuple[str, str], ...]) -> str:
    """gen / train / fwd / none: which knobs matter for a unit."""
    if kinds & GEN_KINDS:
        return "gen"
    if kinds & TRAIN_KINDS:
        return "train"
    if kinds & FWD_KINDS or any(k == "reward" and r == "reward_model" for k, r in sig):
        return "fwd"
    return "none"


class SearchSpace:
    """Enumerates structures, placements and per-unit layouts for one problem."""

    def __init__(
        self,
        base: Graph,
        cluster: Any,
        model: Any,
        *,
        num_devices: int,
        max_seq_tokens: int,
        options: SpaceOptions | None = None,
        workload: Any = None,
    ):
        self.workload = workload  # the runtime's data-parallel rules (_prompts_invalid)
        self.base = base
        self.cluster = cluster
        self.model = model
        self.num_devices = num_devices
        self.max_seq_tokens = max_seq_tokens
        self.opt = options or SpaceOptions()
        self.counts = Counts()
        self._layouts: dict[tuple[str, int], list[Layout]] = {}

    # --- structures ---------------------------------------------------------------------
    def structures(self) -> list[tuple[Structure, Graph]]:
        has_critic = any(_kind(s) == "train_critic" for s in self.base.stages)
        out = []
        for k in range(self.opt.max_staleness + 1):
            for share in self.opt.share if has_critic else (False,):
                for fusion in self.opt.fusions:
                    st = Structure(k, share, fusion)
                    try:
                        g = st.graph(self.base)
                    except GraphError:
                        continue  # e.g. forward fusion without a reference: not a structure
                    out.append((st, g))
        self.counts.structures = len(out)
        return out

    # --- placements ---------------------------------------------------------------------
    def splits(self) -> list[int]:
        """Node-aligned generation device counts for disaggregated placements."""
        gpn = self.cluster.gpus_per_node
        n = self.num_devices
        if n < 2:
            return []
        step = gpn if n >= 2 * gpn else 1  # one node: split its devices
        return [g for g in range(step, n, step)]

    def placements(self, st: Structure, splits: list[int] | None = None) -> list[Placement]:
        n = self.num_devices
        out: list[Placement] = []
        if self.opt.colocated:
            for off in self.opt.offload:
                out.append(Placement(n, 0, offload=off))
        if self.opt.disaggregated:
            for g in self.splits() if splits is None else splits:
                for off in self.opt.offload:
                    if st.staleness >= 1:
                        for pr in self.opt.partial_rollout:
                            out.append(Placement(n, g, offload=off, partial_rollout=pr))
                    else:
                        for sm in self.opt.streaming:
                            out.append(Placement(n, g, offload=off, streaming=sm))
        return out

    # --- layouts ------------------------------------------------------------------------
    def layouts(self, cls: str, n: int) -> list[Layout]:
        """Valid layouts of a unit of class ``cls`` on ``n`` devices (cached)."""
        key = (cls, n)
        if key not in self._layouts:
            self._layouts[key] = self._enumerate(cls, n)
        return self._layouts[key]

    def _enumerate(self, cls: str, n: int) -> list[Layout]:
        o, m, c = self.opt, self.model, self.cluster
        if cls == "none":
            return [Layout()]
        node = c.domain_size  # the node, or an NVL72 rack's NVLink domain
        util = o.gen_memory_utilization
        if cls == "gen":
            grid = itertools.product(o.tp, o.gen_pp, (1,), (1,), (1,), (True,), ("auto",), util)
        else:
            cps = o.cp if self.max_seq_tokens >= o.cp_min_seq_tokens else (1,)
            eps = (1, 2, 4, 8, 16, 32, 64) if getattr(m, "moe", None) else (1,)
            rec = o.recompute if cls == "train" else (True,)
            eng = o.engines
            grid = itertools.product(
                o.tp,
                o.pp,
                cps,
                eps,
                o.micro_batch_sizes,
                rec,
                eng,
                (defaults.SEARCH_GPU_MEMORY_UTILIZATION,),
            )
        out = []
        cuda = not is_cpu(c.gpu)
        for tp, pp, cp, ep, mb, rc, en, ut in grid:
            dp = n // (tp * pp * cp)
            if (
                cls == "train"
                and en == "fsdp"
                and "auto" in eng
                and trains_fsdp("auto", cuda=cuda, dp=dp, pp=pp, cp=cp)
            ):
                continue  # the same layout as engine auto, which runs FSDP there
            lay = Layout(tp, pp, cp, ep, mb, rc, en, ut)
            why = self._invalid(lay, n, node, cls == "gen")
            if why:
                self.counts.reject(why)
                continue
            why = self._prompts_invalid(cls, lay, n)
            if why:
                self.counts.reject(why)
                continue
            out.append(lay)
        self.counts.layouts += len(out)
        return out

    def _prompts_invalid(self, cls: str, lay: Layout, n: int) -> str:
        """The runtime's data-parallel rules (rpeg.compile.compiler, the same checks): every
        data-parallel rank needs a whole prompt group; when dp does not divide the step's
        prompts, sharded training (FSDP, tp > 1) would hang on unequal batches and a rank
        with fewer samples than train_minibatches would run fewer updates (a gen unit may
        be fused with training: held to the same rules)."""
        w = self.workload
        if w is None or cls == "none":
            return ""
        p = w.num_prompts
        dp = n // (lay.tp * lay.pp * lay.cp)
        if dp > p:
            return "runtime: more data-parallel ranks than prompts"
        if cls in ("train", "gen") and p % dp:
            per_rank = (p // dp) * w.samples_per_prompt
            # the training unit's engine as the compiler resolves it (auto: FSDP on CUDA)
            fsdp = lay.engine == "fsdp" or (
                cls == "train"
                and trains_fsdp(
                    lay.engine, cuda=not is_cpu(self.cluster.gpu), dp=dp, pp=lay.pp, cp=lay.cp
                )
            )
            if lay.tp > 1 or lay.ep > 1 or fsdp or per_rank < w.train_minibatches:
                return "runtime: dp does not divide the prompts"
        return ""

    def _invalid(self, lay: Layout, n: int, node: int, gen: bool = False) -> str:
        m = self.model
        if lay.tp * lay.cp > node or node % (lay.tp * lay.cp):
            return "devices"  # a tp/cp group would cross a node
        if n % (lay.tp * lay.pp * lay.cp):
            return "divisibility"
        if m.heads % lay.tp or (m.layers % lay.pp):
            return "divisibility"
        if lay.ep > 1:
            experts = m.moe.experts
            if experts % lay.ep or (n // lay.pp) % lay.ep:
                return "divisibility"
            if self.opt.runtime_only:  # what rpeg.runtime.expert_parallel splits
                from rpeg.search.ep_rules import ep_refusal

                dp = n // (lay.tp * lay.pp * lay.cp)
                why, _ = ep_refusal(m, lay.ep, tp=lay.tp, pp=lay.pp, cp=lay.cp, dp=dp)
                if why:
                    return f"runtime: {why}"
        if self.opt.runtime_only:
            for deg in UNSUPPORTED_DEGREES:
                if getattr(lay, deg) > 1:
                    return f"runtime: {deg}>1 ({UNSUPPORTED_DEGREES[deg]})"
            return _stage_refusal(m, lay, gen)
        return ""


def _stage_refusal(model: Any, lay: Layout, gen: bool) -> str:
    """The runtime's pp/cp rules (:mod:`rpeg.search.stage_rules`) as a search reason."""
    if gen and (lay.pp > 1 or lay.cp > 1):
        return "runtime: pp/cp on a generate unit (generation runs whole or tp-split weights)"
    if lay.pp > 1 and lay.engine == "fsdp":
        return "runtime: pp with fsdp (pipeline stages keep dp replicas)"
    from rpeg.search.stage_rules import layout_refusal

    return layout_refusal(model, lay.pp, lay.cp, lay.tp)
