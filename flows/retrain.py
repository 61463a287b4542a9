"""Operations flows: ``rpeg-train`` (a typed form around ``rl_train``) and ``retrain``.

``rpeg-train`` (:func:`rpeg_train`, parameters :class:`rpeg.flows.params.TrainParams`)
    Resolves the config path/URL plus overrides (refusing bad values before anything
    starts), publishes the plan report, runs :func:`rpeg.flows.train.run_train` (the
    ``rl_train`` flow appears as a subflow), publishes per-step progress and step-metric log
    lines while it runs (tailing ``<output_dir>/metrics.jsonl``), then the metrics table, the
    measured-vs-predicted timeline and a link to the newest checkpoint.

``retrain`` (:func:`retrain`, parameters :class:`rpeg.flows.params.RetrainParams`)
    1. finds the newest file under ``data_glob`` (fsspec; retried),
    2. finds the latest complete checkpoint under the checkpoint URL (step ``s``),
    3. trains ``steps`` more steps (runtime.steps = s + steps, resume on) with
       ``run_train`` (engine ``dask``) or the single-process trainer (engine ``local``),
       in a task with a timeout that is retried once (a retry resumes),
    4. takes the held-out greedy accuracy after training as the score,
    5. promotes: writes ``<checkpoint_url>/latest-good.json`` (step, score, data, flow run)
       only if score >= the previous latest-good score - ``tolerance``; with
       ``keep_promoted`` the checkpoint is also copied to ``<checkpoint_url>/latest-good/``
       so ``keep_last`` pruning never deletes the promoted weights.
"""

# no ``from __future__ import annotations`` here: Prefect builds the parameter model from
# the flow signature, and ``flow.serve`` runs fail on string annotations
# ("RetrainModel is not fully defined")
import contextlib
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow, get_run_logger, task  # noqa: E402
from rpeg.flows import artifacts as art  # noqa: E402
from rpeg.flows.params import RetrainParams, TrainParams  # noqa: E402

from rpeg.config import RunConfig  # noqa: E402

LATEST_GOOD = "latest-good.json"
LATEST_GOOD_DIR = "latest-good"
SCORE_KEY = "heldout_acc_after"


# ============================================================================ storage helpers
def _fs(url: str):
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def newest_file(glob: str, newest_by: str = "mtime") -> str | None:
    """The newest file matching the fsspec ``glob`` as a URL (same protocol), or None."""
    fs, _ = _fs(glob)
    paths = [p for p in fs.glob(glob) if fs.isfile(p)]
    if not paths:
        return None

    def mtime(p: str) -> float:
        info = fs.info(p)
        for k in ("mtime", "LastModified", "last_modified", "updated", "created"):
            v = info.get(k)
            if v is None:
                continue
            if isinstance(v, datetime):
                return v.timestamp()
            if isinstance(v, str):
                try:
                    return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
            return float(v)
        return 0.0

    best = max(paths, key=(lambda p: (mtime(p), p)) if newest_by == "mtime" else (lambda p: p))
    proto = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    return best if proto in ("file", "local") else fs.unstrip_protocol(best)


def latest_step(checkpoint_url: str) -> int:
    """Step of the newest complete checkpoint under ``checkpoint_url`` (0 if none)."""
    from rpeg.runtime.actors.checkpoint import CheckpointStore

    steps = CheckpointStore(checkpoint_url).complete_steps()
    return max(steps, default=0)


def read_latest_good(checkpoint_url: str) -> dict[str, Any] | None:
    """The ``latest-good.json`` pointer next to the checkpoints, or None."""
    fs, root = _fs(checkpoint_url)
    try:
        with fs.open(f"{root}/{LATEST_GOOD}", "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return None


def should_promote(
    score: float, previous: dict[str, Any] | None, tolerance: float = 0.0
) -> tuple[bool, str]:
    """(promote?, reason): promote unless the score regressed below previous - tolerance."""
    if score != score:  # NaN: no evaluation happened
        return False, "no held-out score (empty held-out set)"
    if previous is None or previous.get("score") is None:
        return True, "no previous latest-good checkpoint"
    prev = float(previous["score"])
    if score >= prev - tolerance:
        return True, f"score {score:.4f} >= previous {prev:.4f} - tolerance {tolerance:g}"
    return False, f"score {score:.4f} < previous {prev:.4f} - tolerance {tolerance:g} (regressed)"


def write_latest_good(
    checkpoint_url: str, record: dict[str, Any], *, copy_step: int | None = None
) -> dict[str, Any]:
    """Write the pointer atomically (temp file + move); optionally copy checkpoint
    ``copy_step`` to ``<checkpoint_url>/latest-good/`` first. Returns the record written."""
    fs, root = _fs(checkpoint_url)
    record = dict(record)
    if copy_step is not None:
        src = f"{root}/step-{copy_step:08d}"
        dst = f"{root}/{LATEST_GOOD_DIR}"
        tmp = f"{dst}.tmp"
        for d in (tmp,):
            if fs.exists(d):
                fs.rm(d, recursive=True)
        fs.copy(src, tmp, recursive=True)
        if fs.exists(dst):
            fs.rm(dst, recursive=True)
        fs.mv(tmp, dst, recursive=True)
        record["copy"] = _url(fs, dst)
    data = json.dumps(record, indent=1, sort_keys=True).encode()
    tmp = f"{root}/.{LATEST_GOOD}.tmp"
    with fs.open(tmp, "wb") as fh:
        fh.write(data)
    fs.mv(tmp, f"{root}/{LATEST_GOOD}")
    return record


def _url(fs: Any, path: str) -> str:
    proto = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    return path if proto in ("file", "local") else fs.unstrip_protocol(path)


# ============================================================================ training engines
def local_train(config: RunConfig, *, resume: bool = False, on_step: Any = None) -> dict[str, Any]:
    """Single-process training (:class:`rpeg.runtime.local_trainer.LocalTrainer`) with checkpoints
    in the same store format (``trainer.pt`` part). Same summary keys as ``run_train``."""
    from rpeg.runtime.actors.checkpoint import CheckpointStore, dumps, loads
    from rpeg.runtime.local_trainer import LocalTrainer

    t0 = time.perf_counter()
    rt = config.runtime
    tr = LocalTrainer(config)
    store = (
        CheckpointStore(rt.checkpoint_url, keep_last=rt.keep_last) if rt.checkpoint_url else None
    )
    history: list[dict[str, Any]] = []
    acc_before = None
    if store is not None and (resume or rt.resume):
        got = store.latest()
        if got is not None:
            meta, parts = got
            if "trainer.pt" not in parts:
                from rpeg.errors import ConfigError, Problem

                raise ConfigError(
                    [
                        Problem(
                            "runtime.checkpoint_url",
                            "checkpoint was written by another engine (no trainer.pt); use engine=dask",
                        )
                    ]
                )
            state = loads(parts["trainer.pt"])
            tr.load_state_dict(state["trainer"])
            history = list(state.get("history", []))
            acc_before = state.get("heldout_acc_before")
    if acc_before is None:
        acc_before = tr.evaluate()
    out = Path(rt.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    while tr.step_index < rt.steps:
        m = tr.step()
        history.append(m)
        with open(out / "metrics.jsonl", "w") as fh:
            fh.writelines(json.dumps(h) + "\n" for h in history)
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
            store.save(tr.step_index, {"trainer.pt": dumps(state)}, meta={"engine": "local"})
    acc_after = tr.evaluate()
    rewards = [h.get("reward_mean", 0.0) for h in history]
    return {
        "steps": len(history),
        "wall_s": time.perf_counter() - t0,
        "median_step_s": statistics.median(h["step_s"] for h in history) if history else 0.0,
        "reward_first10": sum(rewards[:10]) / max(len(rewards[:10]), 1),
        "reward_last10": sum(rewards[-10:]) / max(len(rewards[-10:]), 1),
        "heldout_acc_before": acc_before,
        "heldout_acc_after": acc_after,
    }


def dask_train(config: RunConfig, *, resume: bool = False, start_step: int = 0) -> dict[str, Any]:
    """``run_train`` (the ``rl_train`` flow, a subflow here) with a watcher that publishes
    each step's progress and metrics from ``<output_dir>/metrics.jsonl``."""
    from rpeg.flows.train import run_train

    metrics = Path(config.runtime.output_dir) / "metrics.jsonl"
    watcher = art.MetricsWatcher(
        metrics, config.runtime.steps, start_step=start_step, not_before=time.time()
    )
    with watcher:
        return run_train(config, resume=resume, progress=False)


def plan_report_markdown(config: RunConfig) -> tuple[str, list[Any]]:
    """(markdown, predicted timeline records) for the config's plan; best effort."""
    try:
        from rpeg.compile.compiler import resolve
        from rpeg.perf.pricing import predict

        graph, plan = resolve(None, config)
        lines = ["# Execution plan", "", "```yaml", plan.to_yaml().rstrip(), "```", ""]
        try:
            pred = predict(graph, plan, config.workload)
            lines += [
                f"predicted step: **{pred.step_s:.3g} s** on {pred.num_devices} device(s), "
                f"{pred.tokens_per_s_per_gpu:.3g} tokens/s per device, MFU {pred.mfu:.2%}",
                "",
                "| stage | seconds |",
                "| --- | --- |",
            ]
            for r in pred.timeline:
                lines.append(f"| {r.stage} | {r.duration_s:.3g} |")
            return "\n".join(lines) + "\n", list(pred.timeline)
        except Exception as exc:  # noqa: BLE001
            lines.append(f"(no prediction: {type(exc).__name__}: {exc})")
            return "\n".join(lines) + "\n", []
    except Exception as exc:  # noqa: BLE001
        return f"# Execution plan\n\nnot available: {type(exc).__name__}: {exc}\n", []


def _run_engine(config: RunConfig, engine: str, *, resume: bool, start_step: int) -> dict[str, Any]:
    if engine == "local":
        return local_train(config, resume=resume, on_step=lambda s, n, m: art.publish_step(s, n, m))
    return dask_train(config, resume=resume, start_step=start_step)


def _publish_results(
    config: RunConfig, summary: dict[str, Any], predicted: list[Any], start_step: int
) -> None:
    out = Path(config.runtime.output_dir)
    hist = []
    with contextlib.suppress(OSError):
        hist = [
            json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()
        ]
    art.publish_metrics_table(hist)
    measured: list[Any] = []
    try:
        recs = json.loads((out / "timeline.json").read_text())["records"]
        last = max((r.get("step", 0) for r in recs), default=0)
        measured = [dict(r, source="measured") for r in recs if r.get("step", 0) == last]
        offs = min((r["start_s"] for r in measured), default=0.0)
        measured = [dict(r, start_s=r["start_s"] - offs, end_s=r["end_s"] - offs) for r in measured]
    except (OSError, ValueError, KeyError):
        pass
    if measured or predicted:
        art.publish_timeline(measured, out / "timeline.png", predicted=predicted)
    art.publish_summary(summary)
    if config.runtime.checkpoint_url:
        step = latest_step(config.runtime.checkpoint_url)
        if step:
            fs, root = _fs(config.runtime.checkpoint_url)
            art.publish_checkpoint(_url(fs, f"{root}/step-{step:08d}"), step)


# ============================================================================ tasks
@task(name="find-newest-data", retries=3, retry_delay_seconds=[2, 10, 30], timeout_seconds=300)
def find_newest_data(glob: str, newest_by: str = "mtime") -> str | None:
    return newest_file(glob, newest_by)


@task(name="latest-checkpoint", retries=3, retry_delay_seconds=[2, 10, 30], timeout_seconds=300)
def find_latest_checkpoint(checkpoint_url: str) -> dict[str, Any]:
    return {"step": latest_step(checkpoint_url), "latest_good": read_latest_good(checkpoint_url)}


@task(name="train", retries=1, retry_delay_seconds=5)
def train_task(config_json: dict[str, Any], engine: str, start_step: int) -> dict[str, Any]:
    """Train to ``runtime.steps``; a retry resumes from the newest checkpoint."""
    cfg = RunConfig.from_dict(config_json)
    step = latest_step(cfg.runtime.checkpoint_url) if cfg.runtime.checkpoint_url else 0
    summary = _run_engine(cfg, engine, resume=step > 0, start_step=step)
    summary.pop("_extra", None)
    return summary


@task(name="promote", retries=3, retry_delay_seconds=[2, 10, 30], timeout_seconds=600)
def promote_task(checkpoint_url: str, record: dict[str, Any], keep_copy: bool) -> dict[str, Any]:
    return write_latest_good(
        checkpoint_url, record, copy_step=record["step"] if keep_copy else None
    )


# ============================================================================ flows
@flow(name="rpeg-train", persist_result=False, log_prints=False, validate_parameters=True)
def rpeg_train(params: TrainParams) -> dict[str, Any]:
    """Train one run from typed parameters (the UI form); runs ``rl_train`` as a subflow."""
    logger = get_run_logger()
    config = params.resolve()  # ConfigError before anything starts
    from rpeg.flows.train import validate_before_start

    validate_before_start(config)
    logger.info(
        "config %s: %d steps, k=%d, lr=%g",
        params.config,
        config.runtime.steps,
        config.runtime.max_staleness,
        config.optim.lr,
    )
    md, predicted = plan_report_markdown(config)
    art.publish_plan_report(md)
    start = (
        latest_step(config.runtime.checkpoint_url)
        if (params.resume and config.runtime.checkpoint_url)
        else 0
    )
    summary = dask_train(config, resume=params.resume, start_step=start)
    summary.pop("_extra", None)
    _publish_results(config, summary, predicted, start)
    logger.info("summary %s", json.dumps(summary))
    return summary


@flow(name="retrain", persist_result=False, log_prints=False, validate_parameters=True)
def retrain(params: RetrainParams) -> dict[str, Any]:
    """Scheduled retraining: newest data, resume, N steps, evaluate, promote if no regression."""
    logger = get_run_logger()
    params.resolve(base_step=0)  # refuse a bad config/overrides before touching storage
    data_url = None
    if params.data_glob:
        data_url = find_newest_data(params.data_glob, params.newest_by)
        if data_url is None:
            art.publish_markdown(
                f"# retrain skipped\n\nno file matches `{params.data_glob}`\n",
                key="retrain-decision",
            )
            logger.warning("no data under %s; nothing to do", params.data_glob)
            return {"status": "no-data", "promoted": False}
        logger.info("newest data: %s", data_url)
    base_cfg = params.resolve(base_step=0, data_url=data_url)
    ckpt = find_latest_checkpoint(base_cfg.runtime.checkpoint_url)
    base_step, previous = ckpt["step"], ckpt["latest_good"]
    config = params.resolve(base_step=base_step, data_url=data_url)
    if params.engine == "dask":
        from rpeg.flows.train import validate_before_start

        validate_before_start(config)
    logger.info(
        "resuming from step %d, training to step %d (%s engine)",
        base_step,
        config.runtime.steps,
        params.engine,
    )
    md, predicted = plan_report_markdown(config)
    art.publish_plan_report(md)
    summary = train_task.with_options(timeout_seconds=params.train_timeout_s)(
        config.model_dump(mode="json"), params.engine, base_step
    )
    _publish_results(config, summary, predicted, base_step)
    score = float(summary.get(SCORE_KEY, float("nan")))
    step = latest_step(config.runtime.checkpoint_url)
    ok, reason = should_promote(score, previous, params.tolerance)
    fs, root = _fs(config.runtime.checkpoint_url)
    record = {
        "step": step,
        "checkpoint": _url(fs, f"{root}/step-{step:08d}"),
        "score": score,
        "metric": SCORE_KEY,
        "data": data_url,
        "config": params.config,
        "promoted_at": datetime.now(UTC).isoformat(),
        "flow_run_id": art._flow_run_id(),
        "previous": previous,
    }
    if ok and step > base_step:
        record = promote_task(config.runtime.checkpoint_url, record, params.keep_promoted)
        art.publish_checkpoint(record["checkpoint"], step, key="retrain-latest-good", score=score)
        logger.info("promoted step %d: %s", step, reason)
    else:
        if ok:
            ok, reason = False, f"no new checkpoint (step {step} <= {base_step})"
        logger.warning("not promoted: %s", reason)
    art.publish_markdown(
        f"# retrain decision\n\n**{'promoted' if ok else 'not promoted'}**: {reason}\n\n"
        f"- data: `{data_url}`\n- steps: {base_step} -> {step}\n- score ({SCORE_KEY}): {score:.4f}\n"
        f"- previous latest-good: {json.dumps({k: v for k, v in (previous or {}).items() if k != 'previous'})}\n",
        key="retrain-decision",
        description="promotion decision",
    )
    return {
        "status": "promoted" if ok else "kept",
        "promoted": ok,
        "reason": reason,
        "step": step,
        "base_step": base_step,
        "score": score,
        "data": data_url,
        "summary": summary,
    }


__all__ = [
    "LATEST_GOOD",
    "dask_train",
    "find_latest_checkpoint",
    "latest_step",
    "local_train",
    "newest_file",
    "read_latest_good",
    "retrain",
    "rpeg_train",
    "should_promote",
    "write_latest_good",
]
