"""Where a finished training step goes (:class:`StepSink`): metrics.jsonl, TensorBoard when
installed, the progress bar or one line per step, and the Prefect artifacts -- written by a
thread of its own, off the path from one step to the next. Used by :mod:`rpeg.flows.train`."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from rpeg.flows.launch import run_logger

from rpeg.runtime.progress import StepProgress
from rpeg.runtime.run_folder import append_lines, rewrite_lines

log = logging.getLogger("rpeg.flows.train")

#: seconds between two updates of a run's progress artifact and samples table (the first and
#: the last step always update them; every step still writes its log line). Each update is
#: a Prefect API call that the server answers with a database write: measured on the
#: built-in task (0.5 s steps, 2 CPU ranks on 2 cores) one update per step cost 45 ms of
#: every step, the server's CPU taken from the ranks (docs/measurements.md). A step of a GPU
#: run (tens of seconds) updates them every step.
ARTIFACT_EVERY_S = 5.0


def publish_guarded(fn: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``rpeg.flows.artifacts.<fn>`` (the ops helpers: Prefect progress/table/link
    artifacts); an artifact is never worth a failed step, so any error is logged and dropped."""
    try:
        from rpeg.flows import artifacts

        return getattr(artifacts, fn)(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        log.warning("artifact %s skipped: %s", fn, exc)
        return None


class _Metrics:
    """metrics.jsonl (+ ``runtime.loggers``); a rewritten step replaces its line."""

    def __init__(self, out: Path, config: Any = None):
        from rpeg.runtime.loggers import RunLoggers

        self.path = out / "metrics.jsonl"
        self.tb = RunLoggers(out, config)  # as the local trainer's

    def append(self, metrics: dict[str, float]) -> None:
        """One step's line at the end of the file (the common case: the next step), in one
        O_APPEND write: a whole line (rpeg.runtime.run_folder.append_lines)."""
        append_lines(self.path, [json.dumps(metrics)])

    def write_all(self, metrics: dict[int, dict[str, float]]) -> None:
        rewrite_lines(self.path, [json.dumps(metrics[s]) for s in sorted(metrics)])

    def scalar(self, step: int, m: dict[str, float]) -> None:
        self.tb.add(step + 1, m)  # the console's count

    def close(self) -> None:
        self.tb.close()


class StepSink:
    """Where a finished step goes: metrics.jsonl (the next step's line appended; the first
    record and a step recomputed after a recovery rewrite the file, so that step replaces
    its line), TensorBoard when installed, the progress
    bar and the Prefect artifacts. Written by one thread of its own, in order (a record costs
    10-50 ms of file and Prefect API work that the next step need not wait for);
    :meth:`close` waits for every record and raises the first error."""

    def __init__(
        self, out: Path, steps: int, progress: bool, checkpoint_url: Any, config: Any = None
    ):
        from concurrent.futures import ThreadPoolExecutor

        self.steps = steps
        self.shown = progress  # the console gets the run's story (as --local prints it)
        self.metrics = _Metrics(out, config)
        self.progress = StepProgress(steps, progress)  # the local trainer's too
        self.checkpoint_url = checkpoint_url
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpeg-sink")
        self._pending: list[Any] = []
        self._last = -2  # the step recorded last (-2: none yet: the first record rewrites)
        self.watch: Any = None  # rpeg.runtime.degenerate.DegenerateWatch, set by train_body
        self.samples_from: list[Any] | None = None  # the driver's logged samples, per step
        self._samples_seen = 0
        self._artifacts_at: float | None = None  # time.monotonic() of the last update
        self._unpublished: Any = None  # the newest step recorded since that update

    def say(self, line: str) -> None:
        """A line of the run's story: the run's log, and the console when progress is shown
        (the same lines ``--local`` prints)."""
        run_logger().info("%s", line)
        if self.shown:
            from rpeg.runtime.progress import announce

            announce(line)

    def evaluating(self, when: str) -> None:
        if self.shown and when == "before":  # before the first step: the start-up's phase
            from rpeg.runtime.progress import announce

            what = "evaluating the held-out greedy accuracy before RL"
            announce(f"start-up: {what}", label=what)

    def evaluated(self, when: str, accuracy: float, metrics: dict | None = None) -> None:
        """A validation's lines (rpeg.runtime.validation, as ``--local`` prints them); the
        one before RL also goes to TensorBoard at step 0 (a step's are in its line)."""
        from rpeg.runtime.validation import val_line

        if metrics:
            self.say(val_line(metrics, "before RL" if when == "before" else when))
            if when == "before":
                self._pending.append(self._writer.submit(self.metrics.scalar, -1, metrics))
        last = when == "after" or when == f"after step {self.steps}"
        if when == "before" or last:
            which = "before" if when == "before" else "after"
            self.say(f"held-out greedy accuracy {which} RL: {accuracy:.3f}")
        if when == "before" and self.shown:  # until the first step's line: what runs now
            from rpeg.runtime.progress import announce

            what = "step 1 (rollout, rewards, training)"
            announce(f"start-up: {what}", label=what)

    def record(self, ins: Any, history: dict[int, dict[str, float]]) -> None:
        import contextvars

        for f in [f for f in self._pending if f.done()]:  # a failed write fails the run here
            self._pending.remove(f)
            f.result()
        # the next step is appended; the first record of this process, or a step recomputed
        # after a recovery, rewrites the file from the history (issue 28: rewriting it on
        # every step cost 0.36 s per step at 10k steps and a copy of the history per write)
        append = ins.step == self._last + 1
        if append:
            snapshot = {ins.step: dict(history[ins.step])}
        else:
            snapshot = {s: dict(m) for s, m in history.items()}
        self._last = ins.step
        ctx = contextvars.copy_context()  # the flow run's context: its logger and artifacts
        self._pending.append(self._writer.submit(ctx.run, self._write, ins, snapshot, append))
        if self.watch is not None:  # a step that cannot move the policy: warned, then stopped
            self.watch.check(ins.step, ins.metrics)

    def _write(self, ins: Any, history: dict[int, dict[str, float]], append: bool = False) -> None:
        self.metrics.scalar(ins.step, ins.metrics)
        if append:
            self.metrics.append(history[ins.step])
        else:
            self.metrics.write_all(history)
        self.progress.update(ins.step + 1, ins.metrics)
        if ins.checkpoint is not None:
            where = self.checkpoint_url(ins.checkpoint)
            self.say(f"checkpoint step {ins.checkpoint}: {where}")
            if ins.checkpoint == self.steps:  # one artifact per run: the final checkpoint
                publish_guarded("publish_checkpoint", where, ins.checkpoint)
        now = time.monotonic()
        due = (
            self._artifacts_at is None
            or now - self._artifacts_at >= ARTIFACT_EVERY_S
            or ins.step + 1 >= self.steps
        )
        if not due:  # the log line only; the artifacts at the next update (or at close)
            publish_guarded("log_step", ins.step + 1, self.steps, ins.metrics)
            self._unpublished = ins
            return
        self._artifacts_at, self._unpublished = now, None
        publish_guarded("publish_step", ins.step + 1, self.steps, ins.metrics)
        self._publish_samples()

    def _publish_samples(self) -> None:
        got = self.samples_from
        if got is not None and len(got) > self._samples_seen:  # the newest logged samples
            from rpeg.runtime.samples import table_rows

            self._samples_seen = len(got)
            publish_guarded("publish_samples", table_rows(got[-1]), got[-1][0].step)

    def close(self) -> None:
        """Wait for every record (the first error raised), then bring the progress artifact
        and the samples table to the newest step (a run that ended before its last step)."""
        self._writer.shutdown(wait=True)
        ins = self._unpublished
        if ins is not None:
            self._unpublished = None
            publish_guarded("publish_step", ins.step + 1, self.steps, ins.metrics, log_line=False)
            self._publish_samples()
        self.progress.close()
        self.metrics.close()
        for f in self._pending:
            f.result()
