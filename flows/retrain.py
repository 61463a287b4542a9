"""The ``retrain`` flow: scheduled retraining with promotion of a ``latest-good`` checkpoint.

Each run (parameters :class:`rpeg.flows.params.RetrainParams`, one form field each):

1. checks its parameters and the config (a refused run fails with one ERROR line and a
   ``retrain-refused`` artifact, before anything starts);
2. finds the newest file under ``data_glob`` (fsspec; retried) as ``task.url``;
3. finds the latest complete checkpoint under the checkpoint URL (step ``s``; retried);
4. prepares the round as ``rpeg train`` does (:func:`rpeg.preflight.prepare.prepare_run`:
   ``workload.max_prompt_tokens`` from the data, every check and the run's locks, a refusal
   before any cluster starts), then trains ``steps`` more steps (runtime.steps = s + steps,
   resume on) through the one entry (:func:`rpeg.flows.entry.train`) on Dask actors (engine
   ``dask``) or with the single-process trainer (engine ``local``), in a task with a timeout
   that is retried once (a retry resumes), writing to ``<output>/<run name>/``; either
   engine's checkpoints go under ``<checkpoint_url>/retrain/`` (run id ``retrain``);
5. scores the run by the held-out greedy accuracy after training and promotes it unless it
   regressed: ``<checkpoint_url>/latest-good.json`` plus, with ``keep_promoted``, a copy in
   ``<checkpoint_url>/latest-good/`` (what the ``retrain-latest-good`` artifact names).
"""

# no ``from __future__ import annotations`` here: Prefect builds the parameter schema from
# the flow signature's (Annotated) types
import json
from datetime import UTC, datetime
from typing import Any

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from rpeg.flows import artifacts as art  # noqa: E402
from rpeg.flows import launch, reports  # noqa: E402
from rpeg.flows import params as P  # noqa: E402
from rpeg.flows.promotion import (  # noqa: E402
    LATEST_GOOD,
    SCORE_KEY,
    checkpoint_location,
    latest_step,
    newest_file,
    read_latest_good,
    should_promote,
    write_latest_good,
)

from rpeg.config import RunConfig  # noqa: E402
from rpeg.errors import RpegError  # noqa: E402

_NO_CACHE: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
RUN_ID = "retrain"  # the checkpoint run id of every round, either engine


# ============================================================================ tasks
@task(name="find newest data", retries=3, retry_delay_seconds=[2, 10, 30], timeout_seconds=300)
def find_newest_data(glob: str, newest_by: str = "mtime") -> str | None:
    return newest_file(glob, newest_by)


@task(
    name="find latest checkpoint", retries=3, retry_delay_seconds=[2, 10, 30], timeout_seconds=300
)
def find_latest_checkpoint(steps_at: str, checkpoint_url: str) -> dict[str, Any]:
    return {"step": latest_step(steps_at), "latest_good": read_latest_good(checkpoint_url)}


@task(name="train", retries=1, retry_delay_seconds=5, **_NO_CACHE)
def train_task(config_json: dict[str, Any], engine: str) -> dict[str, Any]:
    """Train to ``runtime.steps``; a retry resumes from the newest checkpoint. The one entry
    (rpeg.flows.entry.train) in this task's flow run, on the round the flow body prepared
    (its locks are held there)."""
    from rpeg.flows.entry import train

    from rpeg.preflight.prepare import PreparedRun

    cfg = RunConfig.from_dict(config_json)
    url = cfg.runtime.checkpoint_url
    resume = bool(url) and latest_step(steps_url(url)) > 0
    return train(
        cfg, local=engine == "local", resume=resume, progress=False, prepared=PreparedRun(cfg)
    )


@task(name="promote", retries=3, retry_delay_seconds=[2, 10, 30], timeout_seconds=600)
def promote_task(
    checkpoint_url: str, record: dict[str, Any], keep_copy: bool, steps_url: str
) -> dict[str, Any]:
    return write_latest_good(
        checkpoint_url,
        record,
        copy_step=record["step"] if keep_copy else None,
        steps_url=steps_url,
    )


def steps_url(checkpoint_url: str) -> str:
    """Where a retrain deployment's step folders live: under one stable run id
    (:data:`RUN_ID`), so every round resumes the same run, whichever engine trains it (the
    single-process engine wrote flat under the URL before issue 37)."""
    return f"{checkpoint_url.rstrip('/')}/{RUN_ID}"


# ============================================================================ the flow
@flow(
    name="retrain",
    flow_run_name=launch.retrain_run_name,
    persist_result=False,
    log_prints=False,
    validate_parameters=False,  # checked in the body: a refusal gets a log line and an artifact
)
def retrain(
    steps: P.RetrainSteps = P.D_RETRAIN_STEPS,
    data_glob: P.DataGlob = "",
    lr: P.LearningRate = P.D_LR,
    max_staleness: P.MaxStaleness = P.D_K,
    tolerance: P.Tolerance = 0.0,
    config: P.ConfigPath = "",
    checkpoint_url: P.CheckpointUrl = "",
    output_dir: P.OutputDir = "",
    newest_by: P.NewestBy = "mtime",
    engine: P.Engine = "dask",
    train_timeout_s: P.TrainTimeout = P.D_TIMEOUT_S,
    keep_promoted: P.KeepPromoted = True,
    cluster_address: P.ClusterAddress = "",
    overrides: P.Overrides = {},  # noqa: B006 - never mutated; the form shows {}
) -> Any:
    """Retrain on the newest data from the latest checkpoint; promote unless it regressed."""
    values = dict(locals())
    logger = launch.run_logger()
    try:
        params = P.validate_params(P.RetrainParams, values)
        base_cfg = params.resolve(base_step=0)  # a bad config/overrides: refused here
    except RpegError as exc:
        return launch.refuse(exc)
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
    url = base_cfg.runtime.checkpoint_url
    ckpt = find_latest_checkpoint(steps_url(url), url)
    base_step, previous = ckpt["step"], ckpt["latest_good"]
    try:
        config = params.resolve(base_step=base_step, data_url=data_url)
        config = config.with_overrides({"runtime.run_id": RUN_ID})
        config = launch.with_run_folder(config, params.output_dir)
        # prepared as `rpeg train` prepares a run (its locks too)
        from rpeg.preflight.prepare import prepare_run

        prepared = prepare_run(
            config, local=params.engine == "local", run_folder=False, log=logger.info
        )
        config = prepared.config
    except RpegError as exc:
        return launch.refuse(exc)
    try:
        return _train_and_decide(params, config, base_step, previous, data_url)
    finally:
        prepared.release()


def _train_and_decide(
    params: P.RetrainParams,
    config: RunConfig,
    base_step: int,
    previous: dict[str, Any] | None,
    data_url: str | None,
) -> dict[str, Any]:
    """Train the prepared round, publish its results, promote or not."""
    logger = launch.run_logger()
    logger.info(
        "retrain %s: from step %d to step %d (%s engine), output %s",
        params.config or "built-in config",
        base_step,
        config.runtime.steps,
        params.engine,
        config.runtime.output_dir,
    )
    md, predicted = reports.plan_report(config)
    art.publish_plan_report(md)
    summary = train_task.with_options(timeout_seconds=params.train_timeout_s)(
        config.model_dump(mode="json"), params.engine
    )
    art.publish_results(summary, config.runtime.output_dir, predicted=predicted)
    summary.pop("_extra", None)
    return _decide(params, config, summary, base_step, previous, data_url)


def _decide(
    params: P.RetrainParams,
    config: RunConfig,
    summary: dict[str, Any],
    base_step: int,
    previous: dict[str, Any] | None,
    data_url: str | None,
) -> dict[str, Any]:
    """Promote the new checkpoint unless the score regressed; publish the decision."""
    logger = launch.run_logger()
    url = config.runtime.checkpoint_url
    at = steps_url(url)
    score = float(summary.get(SCORE_KEY, float("nan")))
    step = latest_step(at)
    ok, reason = should_promote(score, previous, params.tolerance)
    record = {
        "step": step,
        "checkpoint": checkpoint_location(at, step),
        "score": score,
        "metric": SCORE_KEY,
        "data": data_url,
        "config": params.config,
        "promoted_at": datetime.now(UTC).isoformat(),
        "flow_run_id": art.flow_run_id(),
        "previous": previous,
    }
    if ok and step > base_step:
        record = promote_task(url, record, params.keep_promoted, at)
        art.publish_checkpoint(
            record.get("copy") or record["checkpoint"],
            step,
            key="retrain-latest-good",
            score=score,
            description=f"latest-good: step {step}, score {score:.4f}",
        )
        logger.info("promoted step %d: %s", step, reason)
    else:
        if ok:
            ok, reason = False, f"no new checkpoint (step {step} <= {base_step})"
        logger.warning("not promoted: %s", reason)
    prev = {k: v for k, v in (previous or {}).items() if k != "previous"}
    art.publish_markdown(
        f"# retrain decision\n\n**{'promoted' if ok else 'not promoted'}**: {reason}\n\n"
        f"- data: `{data_url}`\n- steps: {base_step} -> {step}\n"
        f"- score ({SCORE_KEY}): {score:.4f}\n"
        f"- pointer: `{url.rstrip('/')}/{LATEST_GOOD}`\n"
        f"- previous latest-good: `{json.dumps(prev)}`\n",
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


__all__ = ["find_latest_checkpoint", "find_newest_data", "promote_task", "retrain", "train_task"]
