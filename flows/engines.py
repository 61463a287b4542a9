"""The two training engines a deployed flow can run, in the flow's own run (no subflow).

* :func:`dask_train` -- the runtime's step loop (:func:`rpeg.flows.train._train`) on Dask
  actors; its tasks, step log lines and progress artifact land on the calling flow run.
* :func:`local_train` -- the single-process trainer (:class:`rpeg.runtime.local_trainer.LocalTrainer`)
  in the flow process, checkpointing in the same store format (a ``trainer.pt`` part), for
  small models and CI.

Both return the summary dict of ``run_train`` (``steps``, ``wall_s``, ``median_step_s``,
``reward_first10``, ``reward_last10``, ``heldout_acc_before``, ``heldout_acc_after``) with
``_extra["history"]`` (one metrics dict per step) for the artifacts.
"""

import json
import time
from pathlib import Path
from typing import Any

from rpeg.flows import artifacts as art

from rpeg.config import RunConfig


def dask_train(config: RunConfig, *, resume: bool = False) -> dict[str, Any]:
    """The Dask step loop inside the current flow run (its tasks are this run's tasks)."""
    from rpeg.flows.train import _train

    return _train(config, resume=resume, progress=False)


def local_train(
    config: RunConfig, *, resume: bool = False, on_step: Any = art.publish_step
) -> dict[str, Any]:
    """Single-process training with checkpoints in the store format (a ``trainer.pt`` part);
    ``on_step(step, total, metrics)`` after each step (default: the progress artifact and the
    step's log line)."""
    from rpeg.runtime.actors.checkpoint import CheckpointStore, dumps, loads
    from rpeg.runtime.actors.checkpoint_identity import TRAINER_PART, local_meta
    from rpeg.runtime.local_trainer import LocalTrainer

    t0 = time.perf_counter()
    rt = config.runtime
    tr = LocalTrainer(config)
    store = (
        CheckpointStore(rt.checkpoint_url, keep_last=rt.keep_last) if rt.checkpoint_url else None
    )
    history: list[dict[str, Any]] = []
    acc_before = None
    resumed_at = 0
    if store is not None and (resume or rt.resume):
        got = store.latest()
        if got is not None:
            meta, parts = got
            if TRAINER_PART not in parts:
                from rpeg.errors import ConfigError, Problem

                raise ConfigError(
                    [
                        Problem(
                            "runtime.checkpoint_url",
                            "checkpoint was written by another engine (no trainer.pt); use engine=dask",
                        )
                    ]
                )
            state = loads(parts[TRAINER_PART])
            tr.load_state_dict(state["trainer"])
            history = list(state.get("history", []))
            acc_before = state.get("heldout_acc_before")
            resumed_at = tr.step_index
    from rpeg.runtime.validation import accuracy_of, due

    if acc_before is None and rt.val_before_train and not resumed_at:
        acc_before = tr.evaluate()
    acc_after = None
    out = Path(rt.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the restored steps once, then one appended line per step (issue 28: the whole history
    # was rewritten every step, 2.2 s a step at 50k steps)
    from rpeg.runtime.run_folder import append_lines, rewrite_lines

    rewrite_lines(out / "metrics.jsonl", [json.dumps(h) for h in history])
    while tr.step_index < rt.steps:
        m = tr.step()
        if due(tr.step_index, rt.steps, rt.val_every):  # runtime.val_every, and the last
            m.update(tr.validate())
            if tr.step_index == rt.steps:
                acc_after = accuracy_of(m)
        history.append(m)
        append_lines(out / "metrics.jsonl", [json.dumps(m)])
        if on_step is not None:
            on_step(tr.step_index, rt.steps, m)
        if store is not None and (
            tr.step_index % rt.checkpoint_every == 0 or tr.step_index == rt.steps
        ):
            state = {
                "trainer": tr.state_dict(),
                "history": history,
                "heldout_acc_before": acc_before,
            }
            meta = local_meta(config.model, config)  # resume checks compare it
            store.save(tr.step_index, {TRAINER_PART: dumps(state)}, meta=meta)
    if acc_after is None:  # nothing left to run (resumed at the end)
        acc_after = tr.evaluate()
    from rpeg.runtime.summary import run_summary

    summary = run_summary(
        history,
        wall_s=time.perf_counter() - t0,
        acc_before=acc_before,
        acc_after=acc_after,
        resumed_at=resumed_at,
    )
    summary["_extra"] = {"history": history}
    return summary


__all__ = ["dask_train", "local_train"]
