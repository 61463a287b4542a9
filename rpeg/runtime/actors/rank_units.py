"""A rank's execution units: the compiled units it is handed (:class:`UnitCall`) run stage by
stage on its roles and its batch of the step (the stage loop, streaming through
:mod:`rpeg.runtime.actors.streaming`), and validation.

A part of :class:`rpeg.runtime.actors.rank.RankActor` (``rank.units``) over its models
(:class:`rpeg.runtime.actors.rank_models.RankModels`) and batches
(:class:`rpeg.runtime.actors.rank_data.RankBatches`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from rpeg.ir import StageKind
from rpeg.runtime.actors.rank_data import RankBatches
from rpeg.runtime.actors.rank_models import RankModels
from rpeg.runtime.actors.row_shards import rollout_start
from rpeg.runtime.actors.unit_call import UnitCall
from rpeg.runtime.stage_loop import StageLoop
from rpeg.runtime.stages import StageContext


class RankUnits:
    """Runs a rank's units (remote: ``run_unit``, ``run_units``, ``evaluate``)."""

    def __init__(self, models: RankModels, batches: RankBatches) -> None:
        self.models = models
        self.batches = batches
        self.forwards = 0  # forward calls of the roles' modules (micro_batch_size's observable)
        self._hooked: set[int] = set()

    # ---------------------------------------------------------------- remote
    def run_unit(self, step: int, call: UnitCall) -> Any:
        """Run the stages of one execution unit (``call.unit``) back to back on this rank's
        batch of ``step``, its forward passes at the unit's micro-batch size and token budget.

        ``call.prompts``: this rank's prompts of the step, for a unit that generates. A
        streaming unit that starts with generation (``unit.stream_chunk`` > 0): one decode,
        the unit's later stages run on every ``stream_chunk`` prompts whose samples have
        finished, while the rest decode (:func:`rpeg.runtime.actors.streaming.produce`).
        ``call.stream_from``: run on that generator rank's chunks as they come."""
        if not isinstance(call, UnitCall):
            raise TypeError(f"run_unit: expected a UnitCall, got {type(call).__name__}")
        from rpeg.runtime.actors import streaming

        md = self.models
        unit, prompts, stream_from = call.unit, call.prompts, call.stream_from
        kinds = list(unit.kinds)
        md.fault("generate" if StageKind.generate in kinds else "", step)
        md.fault("train" if any(k.startswith("train_") for k in kinds) else "", step)
        t0 = time.perf_counter()
        self._hook_forwards()
        f0 = self.forwards
        store = self.batches.store
        with self.stage_loop().unit(unit) as loop:  # the one stage loop (rpeg.runtime.stage_loop)
            if stream_from is not None:
                m, spans = streaming.consume(loop, self.batches, step, kinds, stream_from)
            elif unit.stream_chunk and kinds[0] == StageKind.generate and prompts:
                seed, first = rollout_start(md.inputs, step, prompts)
                m, spans = streaming.produce(
                    loop,
                    self.batches,
                    step,
                    kinds,
                    prompts.examples,
                    unit.stream_chunk,
                    seed,
                    first,
                )
                md.residency.after_rollout()
            else:
                examples = None if prompts is None else prompts.examples
                seed, first = rollout_start(md.inputs, step, prompts)
                m, spans = loop.run_stages(
                    kinds, store, step, examples=examples, seed=seed, first_row=first
                )
        from rpeg.runtime import samples as SM
        from rpeg.runtime.actors.dataplane import tensor_bytes
        from rpeg.runtime.actors.unit_result import (
            PipelineAction,
            Span,
            UnitResult,
            counted_tokens,
        )

        if unit.offload:  # moves so far (either way): the plan's offload at work
            m["offload_moves"] = float(md.offloader.moves)
        batch = self.batches.store.get(step)
        m["unit_s"] = time.perf_counter() - t0
        m["forward_calls"] = float(self.forwards - f0)
        logged = (
            batch is not None
            and StageKind.advantage in kinds
            and SM.log_step(step, md.inputs.runtime.log_samples_every)
        )
        return UnitResult(
            metrics=m,
            spans=tuple(Span(*sp) for sp in spans),
            pid=os.getpid(),
            # counted once per dp index, on tp index 0 (unit_result.counted_tokens)
            num_tokens=counted_tokens(
                None if batch is None else batch.num_tokens,
                md.tp_index(StageKind.generate in kinds),
            ),
            rows=None if batch is None else int(batch.size),
            batch_bytes=0 if batch is None else int(tensor_bytes(batch)),
            samples=SM.samples_from_batch(batch, step, rules=md.rewards.names) if logged else (),
            actions=tuple(PipelineAction(*a) for a in pipeline_actions(md.actor)),
        )

    def run_units(self, step: int, calls: list[UnitCall]) -> list[Any]:
        """Several units of ``step`` back to back in one call (a chain of the driver's:
        rpeg.runtime.actors.unit_chains). Their results in order; the first failure ends
        the call."""
        return [self.run_unit(step, c) for c in calls]

    def evaluate(self) -> dict[str, float]:
        """Validation metrics of this rank's actor (rpeg.runtime.validation)."""
        from rpeg.runtime.validation import validation_metrics

        md = self.models
        md.resident()
        return validation_metrics(
            md.actor, md.tokenizer, md.heldout, md.rewards, md.inputs.task.prompt_template
        )

    # ---------------------------------------------------------------- the stage loop
    def stage_loop(self) -> StageLoop:
        """The one stage loop (rpeg.runtime.stage_loop) over this rank's roles as they are
        now (laid out: its data-parallel reduce, its engine's residency), its offloader and
        the staleness bound k of its weight syncs."""
        md = self.models
        ctx = StageContext(
            md.inputs,
            actor=md.actor,
            reference=md.reference,
            critic=md.critic,
            rewards=md.rewards,
            reduce=md.reduce,
        )
        return StageLoop(ctx, md.residency, md.offloader, md.k)

    def _hook_forwards(self) -> None:
        """Count forward calls of every role's module (the observable of micro_batch_size)."""
        md = self.models
        for wk in (md.actor, md.reference, md.critic):
            mod = (getattr(wk, "lm", None) or getattr(wk, "module", None)) if wk else None
            mod = getattr(mod, "model", mod)  # the decoder: log-prob passes skip the LM head
            if mod is None or id(mod) in self._hooked:
                continue
            self._hooked.add(id(mod))
            mod.register_forward_pre_hook(lambda *_a: setattr(self, "forwards", self.forwards + 1))


def pipeline_actions(role: Any) -> list[tuple[str, int, int, float, float, float]]:
    """The actions of ``role``'s pipelined training passes since the last call (a role
    without a pipeline: none)."""
    pipe = getattr(role, "pipeline", None)
    return [] if pipe is None else pipe.take_actions()
