"""The one training entry, :func:`train`: ``rpeg train`` (``--local`` or not), the deployed
``train`` and ``retrain`` flows and Python all start a run through it. It prepares the run
(:func:`rpeg.preflight.prepare.prepare_run`), then runs the single-process trainer's loop
(:meth:`rpeg.runtime.local_trainer.LocalTrainer.run`) or the distributed runtime's flow
(:mod:`rpeg.flows.train`). Nothing here imports Prefect until a distributed run starts
(``rpeg train --local`` never does)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpeg.config import RunConfig
from rpeg.runtime.summary import Summary


def train(
    config: RunConfig,
    *,
    local: bool = False,
    cluster_address: str | None = None,
    resume: bool = False,
    summary_json: str | None = None,
    progress: bool = True,
    run_folder: bool = False,
    prepared: Any = None,
    log: Callable[[str], None] | None = None,
) -> Summary:
    """Train ``config``; the run's summary (:data:`rpeg.runtime.summary.Summary`). The one
    entry of every way a run starts: ``rpeg train`` (``--local`` or not), the deployed
    ``train`` and ``retrain`` flows, and Python.

    The run is prepared first (:func:`rpeg.preflight.prepare.prepare_run`: the data's prompt
    lengths, the run id, every check at once, the locks; bad input is refused before Prefect,
    Dask or a model starts) unless ``prepared`` is given (then it is the caller's to release).
    Then ``local``: the single-process trainer in this process
    (:meth:`rpeg.runtime.local_trainer.LocalTrainer.run`); else the distributed runtime: the
    ``rl_train`` flow on Prefect's ephemeral API, or, called inside a flow or task run (a
    deployment), its body in that run (its tasks and step lines land there, no subflow).
    ``run_folder``: write under ``<output_dir>/<run id>/`` as ``rpeg train`` does (default:
    into ``runtime.output_dir`` itself). ``log``: the single-process trainer's lines (default:
    printed when ``progress``). Tests and benchmarks give a run more through
    :mod:`rpeg.flows.seam` (a running cluster, a fault hook, the summary's ``_extra``)."""
    from rpeg.flows.seam import current_seam

    from rpeg.runtime.main_guard import protect_unguarded_main

    # a script without `if __name__ == "__main__":` is not re-run by the spawned workers
    protect_unguarded_main(log=print if progress else None)
    if resume and not config.runtime.resume:  # the run id is the resumed run's (prepare_run)
        config = config.with_overrides({"runtime.resume": True})
    # against an existing cluster the device count is checked once connected (still before
    # any actor starts)
    address = None if local else cluster_address or config.cluster.address
    if prepared is None:
        from rpeg.preflight.prepare import prepare_run

        mine = prepare_run(
            config,
            local=local,
            cluster_devices=10**6 if address else None,
            run_folder=run_folder,
            log=print if progress else None,
        )
    else:
        mine = None
    ready = prepared if prepared is not None else mine
    run_config, compiled = ready.config, ready.compiled
    if resume and not run_config.runtime.resume:  # prepared without it: checked again
        run_config, compiled = run_config.with_overrides({"runtime.resume": True}), None
    try:
        if local:
            summary = _run_local(run_config, progress=progress, log=log)
        else:
            summary = _run_distributed(run_config, compiled, cluster_address, progress)
    finally:
        if mine is not None:
            mine.release()
    if not current_seam().keep_extra:
        summary.pop("_extra", None)
    if summary_json:
        path = Path(summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({k: v for k, v in summary.items() if k != "_extra"}, indent=1))
    return summary


def _run_local(
    config: RunConfig, *, progress: bool, log: Callable[[str], None] | None
) -> dict[str, Any]:
    """The single-process trainer's loop (:meth:`LocalTrainer.run`); the summary with
    ``_extra["history"]``. Each step also goes to the Prefect run it is called in (the
    progress artifact and a step line: a deployment's ``local`` engine)."""
    from rpeg.flows import artifacts as art

    from rpeg.runtime.local_trainer import LocalTrainer

    if log is None:
        log = print if progress else None
    trainer = LocalTrainer(config, log=log, progress=progress)  # a bar on a terminal
    try:
        summary = trainer.run(on_step=art.publish_step)
    finally:
        trainer.close()  # a vLLM engine's processes and shared memory
    summary["_extra"] = {"history": list(trainer.history)}
    return summary


def _run_distributed(
    config: RunConfig, compiled: Any, cluster_address: str | None, progress: bool
) -> dict[str, Any]:
    """The distributed runtime on a prepared config: the ``rl_train`` flow on Prefect's
    ephemeral API (handed the checked step: it compiles once), its body in the calling
    Prefect run when there is one, or, with a test seam set, in a local flow run."""
    from prefect import flow
    from rpeg.flows.artifacts import in_prefect_run
    from rpeg.flows.run_setup import checked_step
    from rpeg.flows.seam import current_seam
    from rpeg.flows.step_sink import publish_guarded
    from rpeg.flows.train import finished_despite_api, rl_train, train_body

    seam = current_seam()
    resume = config.runtime.resume
    if in_prefect_run() and not seam.active:  # a deployment: its own flow run
        return train_body(
            config,
            cluster_address=cluster_address,
            resume=resume,
            progress=progress,
            compiled=compiled,
        )
    if not seam.active:
        from rpeg.infra.interrupts import start_ephemeral_api

        # Prefect's own start waits 20 s, short of a loaded machine's (issue 44): ours waits
        # up to EPHEMERAL_STARTUP_TIMEOUT_S and says so
        start_ephemeral_api(log=print if progress else None)
        with checked_step(config, compiled):
            return finished_despite_api(
                lambda: rl_train(
                    config=config.model_dump(mode="json"),
                    cluster_address=cluster_address,
                    resume=resume,
                    progress=progress,
                )
            )

    @flow(name="train", persist_result=False, log_prints=False)
    def _inner() -> dict[str, Any]:
        s = train_body(
            config,
            cluster_address=cluster_address,
            resume=resume,
            progress=progress,
            cluster=seam.cluster,
            fault_hook=seam.fault_hook,
            compiled=compiled,
        )
        publish_guarded("publish_results", s, config.runtime.output_dir)
        return s

    return _inner()


def train_on(
    cluster: Any,
    config: RunConfig,
    *,
    fault_hook: Callable[[Any, int], None] | None = None,
    **kw: Any,
) -> Summary:
    """``train(config, **kw)`` for tests and benchmarks (:mod:`rpeg.flows.seam`): on
    ``cluster``, an already started one (None: a LocalCluster of its own), with
    ``fault_hook(run, step)`` at every step's start; the summary keeps its ``_extra``."""
    from rpeg.flows.seam import train_seam

    with train_seam(cluster=cluster, fault_hook=fault_hook, keep_extra=True):
        return train(config, **kw)


__all__ = ["train", "train_on"]
