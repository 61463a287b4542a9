"""The ``train`` flow as a deployment runs it: one training run from a typed form.

Parameters (:class:`rpeg.flows.params.TrainParams`, one form field each, steps first): the
run is refused, before anything starts, when a parameter is out of range or the config
(with the parameters applied) does not validate -- also when the run was created with
the UI's "Validate parameters" switch off -- with one ERROR log line, a ``train-refused``
artifact and a Failed state saying why. Otherwise the run is prepared as ``rpeg train`` prepares
it (:func:`rpeg.preflight.prepare.prepare_run`: ``workload.max_prompt_tokens`` from the data,
every check, the run's locks; a refusal is the same one line and artifact, before any cluster
starts), gets its own output folder (``<output>/<run name>/``, the run name is its run id), publishes the plan report (with the step graph), trains on
Dask actors *in this flow run* (its tasks, one log line per step and the progress bar are
this run's, no subflow) and publishes the results once: metrics table, reward/accuracy
curve, predicted-vs-measured Gantt chart, summary, checkpoint location.

``rpeg train`` and :func:`rpeg.flows.train.run_train` run the same job from a config object
under the same flow name, ``train``.
"""

# no ``from __future__ import annotations`` here: Prefect builds the parameter schema from
# the flow signature's (Annotated) types
from typing import Any

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow  # noqa: E402
from rpeg.flows import artifacts as art  # noqa: E402
from rpeg.flows import launch, reports  # noqa: E402
from rpeg.flows import params as P  # noqa: E402

from rpeg.errors import RpegError  # noqa: E402


@flow(
    name="train",
    flow_run_name=launch.train_run_name,
    persist_result=False,
    log_prints=False,
    validate_parameters=False,  # checked in the body: a refusal gets a log line and an artifact
)
def train(
    steps: P.Steps = P.D_STEPS,
    lr: P.LearningRate = P.D_LR,
    max_staleness: P.MaxStaleness = P.D_K,
    num_prompts: P.NumPrompts = P.D_PROMPTS,
    samples_per_prompt: P.SamplesPerPrompt = P.D_SAMPLES,
    resume: P.Resume = False,
    config: P.ConfigPath = "",
    checkpoint_url: P.CheckpointUrl = "",
    output_dir: P.OutputDir = "",
    cluster_address: P.ClusterAddress = "",
    overrides: P.Overrides = {},  # noqa: B006 - never mutated; the form shows {}
) -> Any:
    """Train one run from the form's values (the config supplies everything else)."""
    values = dict(locals())
    logger = launch.run_logger()
    try:
        params = P.validate_params(P.TrainParams, values)
        prepared = launch.prepare_deployed(params.resolve(), params.output_dir)
    except RpegError as exc:  # before any cluster starts: one line, an artifact, Failed
        return launch.refuse(exc)
    cfg = prepared.config
    try:
        logger.info(
            "train %s: %d steps, k=%d, lr=%g, %d prompts x %d samples, output %s",
            params.config or "built-in config",
            cfg.runtime.steps,
            cfg.runtime.max_staleness,
            cfg.optim.lr,
            cfg.workload.num_prompts,
            cfg.workload.samples_per_prompt,
            cfg.runtime.output_dir,
        )
        md, predicted = reports.plan_report(cfg)
        art.publish_plan_report(md)
        from rpeg.flows.entry import train as run

        # the one entry, on the prepared run (its compiled step: the run compiles once); in
        # this flow run, no subflow
        summary = run(cfg, resume=params.resume, progress=False, prepared=prepared)
    finally:
        prepared.release()
    art.publish_results(summary, cfg.runtime.output_dir, predicted=predicted)
    summary.pop("_extra", None)
    return summary


__all__ = ["train"]
