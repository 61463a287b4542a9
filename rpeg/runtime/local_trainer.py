"""The single-process reference trainer: the compiled step's units (one group on one device,
:func:`rpeg.compile.compile_local`) run in order, one RL step at a time.

The distributed runtime must reproduce what this does; both build their roles one way
(:func:`rpeg.runtime.role_builder.build_roles`, the engine resolved by the one rule,
:func:`rpeg.runtime.engines.choice.rank_engine`) and run every unit through the one stage
loop (:class:`rpeg.runtime.stage_loop.StageLoop`: the unit's micro-batching and offload, the
stages, the one staleness rule at ``sync_weights``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rpeg.compile.step import DEFAULT_DEVICE_TYPE, CompiledStep
from rpeg.config import RunConfig
from rpeg.ir import StageKind
from rpeg.runtime import stages
from rpeg.runtime.actors import weight_sync
from rpeg.runtime.actors.checkpoint import (
    CheckpointError,
    CheckpointStore,
    dumps,
    find_checkpoint,
    loads,
)
from rpeg.runtime.actors.checkpoint_identity import TRAINER_PART, local_meta
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.data import DataCursor, Example
from rpeg.runtime.engines.choice import rank_engine
from rpeg.runtime.engines.residency import EngineResidency
from rpeg.runtime.engines.row_sampling import rollout_seed
from rpeg.runtime.role_builder import all_roles, build_roles
from rpeg.runtime.samples import keep_samples_upto
from rpeg.runtime.stage_loop import StageLoop


class LocalTrainer:
    """GRPO / PPO / RLOO / REINFORCE++ in one process.

    ``step()`` runs the compiled step's units in order: generate -> reward -> ref log-probs ->
    old log-probs -> values -> advantages -> train actor (-> train critic) -> weight sync
    (bounded staleness). ``compiled``: the step to run (default: :func:`compile_local` of
    ``config``).
    """

    def __init__(
        self,
        config: RunConfig | None = None,
        *,
        compiled: CompiledStep | None = None,
        log: Callable[[str], None] | None = None,
        progress: bool = False,
    ):
        self.config = config or RunConfig()
        self.log = log or (lambda s: None)
        self.progress = progress  # a bar on a terminal (else one line per step through log)
        c = self.config
        if compiled is None:
            from rpeg.compile import compile_local
            from rpeg.errors import RpegError
            from rpeg.specs.hf import priced_model

            try:  # the policy's shape (a folder's config.json): which units can pack
                spec = priced_model(c.model)
            except RpegError:  # an unknown name: the model's checks say so when it loads
                spec = None
            compiled = compile_local(c, spec)
        self.compiled = compiled
        self.k = compiled.staleness
        # the group's engine, resolved once by the rule the driver resolves each group's with
        # (engines.choice.rank_engine: rpeg.runtime.actors.programs), on the device this
        # process builds its roles on: build_roles without a device, the default device type
        group = dataclasses.replace(compiled.actor_groups[0], device_type=DEFAULT_DEVICE_TYPE)
        self.engine = rank_engine(c, group)
        built = build_roles(
            c,
            all_roles(c),
            engine=self.engine,
            lagging_engine=self.k > 0,  # a generator with its own weights
            colocated=True,
            engine_eager=group.gen_enforce_eager,  # the plan's generate unit's (vLLM)
            log=self.log,
        )
        self.rewards, self.cursor, self.heldout = built.rewards, built.cursor, built.heldout
        self.tokenizer, self.warmup_info = built.tokenizer, built.warmup_info
        self.actor, self.reference, self.critic = built.actor, built.reference, built.critic
        self.actor.max_staleness = self.k  # checked before every optimizer update
        # colocated: the engine sleeps while the trainer runs (where it has sleep mode)
        self.residency = EngineResidency(self.actor.engine, colocated=True, log=self.log)
        from rpeg.runtime.unit_memory import Offloader, apply_recompute

        if compiled.actor_groups and compiled.actor_groups[0].recompute:
            for wk in (self.actor, self.critic):  # the plan's recompute: layers checkpointed
                if wk is not None and getattr(wk, "optimizer", None) is not None:
                    apply_recompute(wk.module)
        # units with offload: their roles' state in host memory between uses (here the
        # host is the device: the moves run and cost nothing)
        roles = {"actor": self.actor, "reference": self.reference, "critic": self.critic}
        self.offloader = Offloader(roles, next(self.actor.module.parameters()).device)
        # the one stage loop (rpeg.runtime.stage_loop), as every rank runs its units
        self.loop = StageLoop(
            stages.StageContext(
                c,
                actor=self.actor,
                reference=self.reference,
                critic=self.critic,
                rewards=self.rewards,
            ),
            self.residency,
            self.offloader,
            self.k,
        )
        self.step_index = 0
        self.history: list[dict[str, float]] = []

    # --- one RL step ----------------------------------------------------------------------
    def stage_kinds(self) -> list[StageKind]:
        """The stage kinds of one step, in the compiled step's order."""
        return [k for t in self.compiled.tasks for k in t.kinds]

    def step(self) -> dict[str, float]:
        """The compiled step's units in order through the stage loop (the rank's loop: each
        unit's micro-batching and offload, the one staleness rule at ``sync_weights``)."""
        c = self.config
        t0 = time.perf_counter()
        m: dict[str, float] = {"step": self.step_index + 1}  # 1-based, as the console counts
        store: dict[int, RolloutBatch | None] = {}
        seed = rollout_seed(c.runtime.seed, self.step_index)
        for unit in self.compiled.tasks:
            examples = self.cursor.next(c.workload.num_prompts) if unit.generates else None
            with self.loop.unit(unit) as run:
                um, _spans = run.run_stages(unit.kinds, store, 0, examples=examples, seed=seed)
            m.update(um)
        self.offloader.restore_all()  # resident between steps (checkpoints, evaluation)
        if StageKind.sync_weights not in self.stage_kinds():
            # a graph without a sync_weights stage still obeys the bound
            m.update(weight_sync.refresh_lagging_engine(self.actor, self.residency, self.k))
        batch = store[0]
        self.last_batch = batch
        m["step_s"] = time.perf_counter() - t0
        m["tokens_per_s"] = batch.num_tokens / m["step_s"]
        self.step_index += 1
        self.history.append(m)
        return m

    # --- evaluation -----------------------------------------------------------------------
    def validate(self, examples: list[Example] | None = None) -> dict[str, float]:
        """Validation metrics (``val/accuracy``, ``val/<source>/accuracy``, ...:
        rpeg.runtime.validation) of the current weights on the held-out examples."""
        from rpeg.runtime.validation import validation_metrics

        examples = self.heldout if examples is None else examples
        return validation_metrics(
            self.actor, self.tokenizer, examples, self.rewards, self.config.task.prompt_template
        )

    def evaluate(self, examples: list[Example] | None = None) -> float:
        """Greedy accuracy on the held-out examples (a fraction in [0, 1]; NaN without)."""
        from rpeg.runtime.validation import accuracy_of

        return accuracy_of(self.validate(examples))

    # --- run ------------------------------------------------------------------------------
    def run(
        self,
        steps: int | None = None,
        out_dir: str | Path | None = None,
        *,
        on_step: Callable[[int, int, dict[str, float]], object] | None = None,
    ) -> dict:
        """Train to ``steps`` (default ``runtime.steps``). With ``runtime.checkpoint_url``
        a checkpoint is written every ``checkpoint_every`` steps and at the end, through the
        same :class:`CheckpointStore` (and run ids) as the distributed runtime; with
        ``runtime.resume`` / ``resume_from`` the run continues from one. ``on_step(step,
        steps, metrics)`` after each step's record (a deployment's progress artifact). The
        one single-process loop: ``rpeg.flows.entry.train(config, local=True)`` runs it."""
        rt = self.config.runtime
        steps = steps or rt.steps
        out = Path(out_dir or rt.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        store = CheckpointStore.for_run(rt) if rt.checkpoint_url else None
        if not (rt.resume or rt.resume_from):  # a new run's samples start a new file
            from rpeg.runtime.samples import SAMPLES_FILE

            (out / SAMPLES_FILE).unlink(missing_ok=True)
        resuming = bool(rt.resume or rt.resume_from)
        acc_before = self._restore(store) if resuming else None
        if resuming:  # steps after the checkpoint log their samples again
            keep_samples_upto(out, self.step_index)
        resumed_at = self.step_index  # steps_run: this call's steps (after a resume: fewer)
        from rpeg.runtime.loggers import RunLoggers
        from rpeg.runtime.validation import accuracy_of, due, val_line

        tb = RunLoggers(out, self.config)  # runtime.loggers, as the distributed runtime's
        if resuming:
            self.log(f"resumed at step {self.step_index} (run {getattr(store, 'run_id', '')})")
        elif rt.val_before_train:
            from rpeg.runtime.progress import current_ticker  # rpeg train's start-up lines

            current_ticker().phase("evaluating the held-out set before RL")
            before = self.validate()
            acc_before = accuracy_of(before)
            self.log(val_line(before, "before RL"))
            tb.add(0, before)  # verl's step-0 validation
        if acc_before is not None:
            self.log(f"held-out greedy accuracy before RL: {acc_before:.3f}")
        from rpeg.runtime.progress import current_ticker  # until the first step's line

        current_ticker().phase("step 1 (rollout, rewards, training)")
        acc_after = None
        from rpeg.runtime.run_folder import append_lines, rewrite_lines

        metrics_path = out / "metrics.jsonl"
        rewrite_lines(metrics_path, [json.dumps(h) for h in self.history])
        from rpeg.runtime.degenerate import DegenerateWatch
        from rpeg.runtime.progress import StepProgress

        greedy = self.config.workload.temperature == 0
        watch = DegenerateWatch(rt.degenerate_steps_limit, greedy=greedy)
        bar = None if self.progress else False  # None: a bar when stdout is a terminal
        shown = StepProgress(steps, echo=self.log, bar=bar, start=self.step_index)
        while self.step_index < steps:
            m = self.step()
            val = None
            if due(self.step_index, steps, rt.val_every):  # in the step's line
                val = self.validate()
                m.update(val)
                if self.step_index == steps:
                    acc_after = accuracy_of(val)
            append_lines(metrics_path, [json.dumps(m)])  # a whole line, one write
            watch.check(int(m["step"]) - 1, m)  # after its line: the record shows the step
            tb.add(self.step_index, m)
            shown.update(int(m["step"]), m)
            if val is not None:
                self.log(val_line(val, f"after step {self.step_index}"))
            if on_step is not None:
                on_step(self.step_index, steps, m)
            self._log_samples(int(m["step"]) - 1, out)  # before a checkpoint covers it
            if store is not None and (
                self.step_index % rt.checkpoint_every == 0 or self.step_index == steps
            ):
                self._save(store, acc_before)
        shown.close()
        tb.close()
        if acc_after is None:  # nothing left to run (resumed at the end)
            acc_after = self.evaluate()
        self.log(f"held-out greedy accuracy after RL: {acc_after:.3f}")
        from rpeg.runtime.summary import run_summary

        summary = run_summary(
            self.history,
            wall_s=time.perf_counter() - t0 + float(self.warmup_info.get("warmup_s", 0.0)),
            acc_before=acc_before,
            acc_after=acc_after,
            resumed_at=resumed_at,  # wall_s of the whole run after a resume (issue 28)
        )
        syncs = [h["weight_sync_bytes"] for h in self.history if "weight_sync_bytes" in h]
        if syncs:  # an engine with weights of its own (vLLM): what each sync moved
            summary["weight_sync_bytes"] = float(statistics.median(syncs))
        plot_rewards(self.history, out / "reward_curve.png", acc_before, acc_after)
        summary["steps_run"] = self.step_index - resumed_at
        return summary

    def close(self) -> None:
        """Stop the generation engine's own processes (vLLM's engine core; nothing for the
        torch engine). The CLI calls it when a run ends, fails or is interrupted."""
        from rpeg.runtime.engines.vllm import shutdown_engine

        shutdown_engine(self.actor.engine)

    def _log_samples(self, step: int, out: Path) -> None:
        """samples.jsonl (+ a few printed) every ``runtime.log_samples_every`` steps."""
        from rpeg.runtime import samples as S

        if S.log_step(step, self.config.runtime.log_samples_every):
            got = S.samples_from_batch(self.last_batch, step, rules=self.rewards.names)
            S.append_samples(out, got)
            for line in S.sample_lines(got):
                self.log(line)

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The step, the data cursor and the roles' state in the format the ranks write
        (rpeg.runtime.actors.checkpoint.roles_state)."""
        from rpeg.runtime.actors.checkpoint.rank_state import roles_state

        st = roles_state(self._roles())
        st.update(step=self.step_index, cursor=self.cursor.state_dict())
        return st

    def load_state_dict(self, state: dict) -> None:
        from rpeg.runtime.actors.checkpoint.rank_state import load_roles_state

        self.step_index = int(state["step"])
        load_roles_state(state, self._roles())
        self.cursor.load_state_dict(state["cursor"])

    def _roles(self) -> dict:
        # the frozen reference is rebuilt from its source on resume, as it always was here
        return {"actor": self.actor, "critic": self.critic}

    def _save(self, store: CheckpointStore, acc_before: float | None) -> None:
        state = {
            "trainer": self.state_dict(),
            "history": self.history,
            "heldout_acc_before": acc_before,
        }
        info = store.save(
            self.step_index,
            {TRAINER_PART: dumps(state)},
            meta=local_meta(self.config.model, self.config),
        )
        self.log(f"checkpoint step {self.step_index}: {info.path}")
        from rpeg.runtime.export import export_at_checkpoint

        export_at_checkpoint(self.config, info.path, self.step_index, self.log)

    def _restore(self, store: CheckpointStore | None) -> float | None:
        """Load the newest checkpoint (``store.latest()``, or ``resume_from``); return the
        held-out accuracy recorded before RL. Nothing usable is an error listing what was
        found (``CheckpointStore.latest`` with ``must_resume``)."""
        rt = self.config.runtime
        got = store.latest() if store is not None else find_checkpoint(rt.resume_from)
        if got is None:
            raise CheckpointError(f"nothing usable to resume from at {rt.resume_from}")
        meta, parts = got
        if TRAINER_PART not in parts:
            raise CheckpointError(
                f"checkpoint step {meta.get('step')} was written by the distributed runtime "
                f"(parts {sorted(parts)}, no {TRAINER_PART}); resume it without --local"
            )
        failed: list[str] = []
        while True:  # a part that verifies but does not load (another model's weights under
            # a forged checksum, issue 44): named, and the previous checkpoint is loaded
            try:
                state = loads(parts[TRAINER_PART])
                self.load_state_dict(state["trainer"])
                break
            except (CheckpointError, KeyError, TypeError) as exc:
                part = f"{meta.get('dir_url', meta.get('step'))}/{TRAINER_PART}"
                failed.append(f"{part}: {exc}")
                older = _older_checkpoint(store, int(meta.get("step") or 0))
                if older is None:
                    raise CheckpointError(
                        "; ".join(failed) + "; no earlier checkpoint of the run loads"
                    ) from None
                self.log(
                    f"warning: {part} does not load ({exc}); falling back to checkpoint "
                    f"step {older[0].get('step')}"
                )
                meta, parts = older
        self.history = list(state.get("history", []))
        got = state.get("heldout_acc_before")  # None: runtime.val_before_train was off
        return None if got is None else float(got)


def _older_checkpoint(store: CheckpointStore | None, step: int):
    """The newest complete, verified checkpoint of ``store`` before ``step`` holding a
    trainer part (None: none)."""
    if store is None:
        return None
    for s in sorted((s for s in store.complete_steps() if s < step), reverse=True):
        try:
            meta, parts = store.verify(s)
        except CheckpointError:
            continue
        if TRAINER_PART in parts:
            return meta, parts
    return None


def plot_rewards(
    history: list[dict], path: Path, acc_before: float | None, acc_after: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(h["step"]) for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward_mean"] for h in history], label="reward (mean)")
    ax.plot(steps, [h["accuracy"] for h in history], label="sample accuracy", alpha=0.6)
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    before = "-" if acc_before is None else f"{acc_before:.2f}"
    ax.set_title(f"held-out greedy acc {before} -> {acc_after:.2f}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["LocalTrainer", "RolloutBatch", "DataCursor", "plot_rewards"]
