"""The one stage loop: a compiled unit's stages, in order, on the roles of one process.

The single-process trainer (:mod:`rpeg.runtime.local_trainer`) and every rank
(:mod:`rpeg.runtime.actors.rank_units`, and its streaming units:
:mod:`rpeg.runtime.actors.streaming`) run the compiled step's units through it, so the two
runtimes cannot drift apart. What differs between them is said in arguments: the roles and
reduce of the :class:`~rpeg.runtime.stages.StageContext`, the store the batches are kept in,
the prompts and seed of a unit that generates.

* :meth:`StageLoop.unit`: while a compiled unit (:class:`rpeg.compile.step.TaskSpec`) runs,
  the roles it offloads are on the device (:class:`rpeg.runtime.unit_memory.Offloader`) and
  its roles' passes are cut as the unit says
  (:func:`rpeg.runtime.micro_batches.unit_micro_batches`); the stages see the unit
  (``StageContext.unit``: its ``shared_forward``).
* :meth:`StageLoop.run_stages`: stage kinds one after another on the batch kept under a key
  of a store, each through :func:`rpeg.runtime.stages.run_stage`; ``sync_weights`` is the
  one staleness rule (:func:`rpeg.runtime.actors.weight_sync.refresh_lagging_engine`).
  -> (metrics, spans).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rpeg.compile.step import TaskSpec
from rpeg.ir import StageKind
from rpeg.runtime.actors import weight_sync
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.data import Example
from rpeg.runtime.micro_batches import unit_micro_batches
from rpeg.runtime.stages import StageContext, env_span, run_stage

if TYPE_CHECKING:
    from rpeg.runtime.engines.residency import EngineResidency
    from rpeg.runtime.unit_memory import Offloader

#: a stage's timeline span ``(kind, start, end)`` (wall-clock seconds)
Span = tuple[str, float, float]
#: what running stages returns: their metrics and their spans
Ran = tuple[dict[str, Any], list[Span]]


@dataclass(frozen=True)
class StageLoop:
    """What one process runs a unit's stages with: the stage context (its config sections,
    roles, rewards and data-parallel reduce), its generation engine's residency, its
    offloader and the staleness bound k of its weight syncs."""

    ctx: StageContext
    residency: EngineResidency
    offloader: Offloader
    staleness: int

    @contextlib.contextmanager
    def unit(self, unit: TaskSpec) -> Iterator[StageLoop]:
        """The loop for ``unit``'s stages: offloaded roles it computes with back before it,
        its roles' passes cut at its micro-batch size / token budget while it runs, its
        ``offload`` applied once it has run. Yields the loop whose stages see the unit."""
        kinds = list(unit.kinds)
        ctx = self.ctx
        self.offloader.before(kinds)
        with unit_micro_batches((ctx.actor, ctx.reference, ctx.critic), unit):
            yield dataclasses.replace(self, ctx=dataclasses.replace(ctx, unit=unit))
        self.offloader.after(kinds, unit.offload)

    def run_stages(
        self,
        kinds: Sequence[str],
        store: MutableMapping[Any, RolloutBatch | None],
        key: Any,
        *,
        examples: Sequence[Example] | None = None,
        seed: int | None = None,
        first_row: int = 0,
    ) -> Ran:
        """``kinds`` one after another on the batch kept in ``store`` under ``key``, each
        stage's output stored back. ``examples``, ``seed``, ``first_row``: the prompts of a
        ``generate`` stage, its seed and its rows' first position in the step's rollout.
        -> (metrics, spans)."""
        m: dict[str, Any] = {}
        spans: list[Span] = []
        for kind in kinds:
            ts = time.time()
            batch = store.get(key)
            if kind == StageKind.sync_weights:
                m.update(
                    weight_sync.refresh_lagging_engine(
                        self.ctx.actor, self.residency, self.staleness
                    )
                )
            elif kind == StageKind.env and spans:  # ran inside generate's turns: env_s
                spans.append(env_span(spans[-1][2], m))
                continue
            else:
                batch, sm = run_stage(
                    kind, self.ctx, batch, examples=examples, seed=seed, first_row=first_row
                )
                m.update(sm)
                if kind == StageKind.generate:
                    self.residency.after_rollout()
            store[key] = batch
            spans.append((kind, ts, time.time()))
        return m, spans
