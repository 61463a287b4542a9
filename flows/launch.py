"""What every deployable flow does when it starts: name the run, check the parameters,
refuse bad ones in one line, and give the run its own output folder.

* Run names read like the job: ``<config>-<N>-steps-<id>`` (``tiny-20-steps-3fa2c1``) for
  ``train``, ``<config>-retrain-<N>-steps-<id>`` for ``retrain``; ``<id>`` is the start of
  the flow run's id, so names are unique and folders do not collide.
* :func:`refuse` turns a refused run into one ERROR log line, a ``refused`` markdown
  artifact and a ``Failed`` final state whose message is the same line (no traceback).
* :func:`with_run_folder` points ``runtime.output_dir`` at ``<base>/<run name>/`` and
  ``<base>/latest`` at it.
"""

from __future__ import annotations

import logging
from typing import Any

from rpeg.flows import artifacts as art
from rpeg.flows.outputs import base_folder, point_latest, run_folder, safe_name

from rpeg.config import RunConfig

log = logging.getLogger("rpeg.flows.launch")


def run_logger() -> Any:
    """The Prefect run logger inside a run (its lines show in the UI), else a module logger."""
    return art.run_logger()


def short_id() -> str:
    from prefect.runtime import flow_run

    rid = str(flow_run.id or "")
    return rid.replace("-", "")[:6] or "local"


def _param(name: str, default: Any = "") -> Any:
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    return params.get(name, default)


def _label(config: Any) -> str:
    from rpeg.flows.params import TrainParams

    p = TrainParams.model_construct(config=str(config or ""))
    return p.config_label()


def _named(make: Any, fallback: str) -> Any:
    """A run-name callable that never fails the run (a bad parameter is refused later)."""

    def name() -> str:
        try:
            return make()
        except Exception:  # noqa: BLE001
            return f"{fallback}-{short_id()}"

    name.__name__ = make.__name__
    name.__doc__ = make.__doc__
    return name


def _train_name() -> str:
    """``<config>-<steps>-steps-<id>`` for the ``train`` form flow."""
    return f"{_label(_param('config'))}-{_param('steps', '?')}-steps-{short_id()}"


def _retrain_name() -> str:
    """``<config>-retrain-<steps>-steps-<id>`` for ``retrain``."""
    return f"{_label(_param('config'))}-retrain-{_param('steps', '?')}-steps-{short_id()}"


def _config_name() -> str:
    """``<model>-<steps>-steps-<id>`` for the raw-config training flow (``rpeg train``)."""
    cfg = _param("config", None) or {}
    model = (cfg.get("model") or {}).get("name") or "rpeg"
    steps = (cfg.get("runtime") or {}).get("steps") or RunConfig().runtime.steps
    return f"{model}-{steps}-steps-{short_id()}"


train_run_name = _named(_train_name, "train")
retrain_run_name = _named(_retrain_name, "retrain")
config_run_name = _named(_config_name, "train")


def refuse(exc: BaseException) -> Any:
    """One ERROR log line, a ``refused`` artifact, and the ``Failed`` state to return."""
    from prefect.states import Failed
    from rpeg.flows.params import one_line

    line = one_line(exc)
    run_logger().error(line)
    art.publish_refused(line)
    return Failed(message=line)


def with_run_folder(config: RunConfig, param_output_dir: str = "") -> RunConfig:
    """``config`` writing to ``<base>/<run name>/`` (``<base>/latest`` points there)."""
    from prefect.runtime import flow_run

    base = base_folder(config.runtime.output_dir, param_output_dir)
    folder = run_folder(base, flow_run.name or f"run-{short_id()}")
    point_latest(folder)
    return config.with_overrides({"runtime.output_dir": str(folder)})


def prepare_deployed(config: RunConfig, param_output_dir: str = "") -> Any:
    """A deployed run prepared as ``rpeg train`` prepares one
    (:func:`rpeg.preflight.prepare.prepare_run`): its run id is the flow run's name (unless
    the config sets one or the run resumes), its folder ``<base>/<run name>/``. Raises the
    named error of a refusal (ConfigError, RunLocked) before any cluster starts."""
    from prefect.runtime import flow_run

    from rpeg.preflight.prepare import prepare_run

    if param_output_dir:
        config = config.with_overrides({"runtime.output_dir": param_output_dir})
    prepared = prepare_run(
        config,
        cluster_devices=10**6 if config.cluster.address else None,
        new_id=safe_name(flow_run.name or f"run-{short_id()}"),
        log=run_logger().info,
    )
    return prepared


__all__ = [
    "config_run_name",
    "prepare_deployed",
    "refuse",
    "retrain_run_name",
    "run_logger",
    "short_id",
    "train_run_name",
    "with_run_folder",
]
