"""Where a run's per-step metrics go besides ``metrics.jsonl``: ``runtime.loggers``, the same
from both runtimes, one point per step at the step number the console prints (1, 2, ...),
every numeric metric of the step's line.

* ``tensorboard``: event files under ``<output_dir>/tb``;
* ``wandb``: a W&B run in ``<output_dir>`` (project ``$WANDB_PROJECT`` or ``rpeg``); offline
  (``wandb sync`` later) unless ``WANDB_MODE`` or ``WANDB_API_KEY`` says otherwise;
* ``mlflow``: an MLflow run (experiment ``rpeg``) in ``$MLFLOW_TRACKING_URI``, or a local
  SQLite store ``<output_dir>/mlflow.db`` (``mlflow ui --backend-store-uri
  sqlite:///<output_dir>/mlflow.db``; MLflow 3 refuses its old ``./mlruns`` file store).

Unset (the default): ``[tensorboard]`` when tensorboard is installed (it is a dependency),
else none. A named logger whose package is missing is refused before anything starts
(:func:`logger_problems`, called by the preflight), naming the install command. Packages
are imported only when named."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rpeg.errors import Problem

TB_DIR = "tb"
MLFLOW_DB = "mlflow.db"
#: logger name -> (module that must import, the install command)
PACKAGES = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def logger_names(config: Any) -> tuple[str, ...]:
    """``runtime.loggers``, or the default: tensorboard when installed (also without a
    config)."""
    names = None if config is None else config.runtime.loggers
    if names is None:
        return ("tensorboard",) if _installed("tensorboard") else ()
    return tuple(dict.fromkeys(names))


def logger_problems(config: Any) -> list[Problem]:
    """A named logger whose package is not installed (names are checked by the schema)."""
    out = []
    for name in logger_names(config):
        module, cmd = PACKAGES[name]
        if not _installed(module):
            out.append(
                Problem(
                    "runtime.loggers",
                    f"{name!r} is named but {module} is not installed: `{cmd}` (or drop it "
                    f"from the list; allowed: {', '.join(PACKAGES)})",
                )
            )
    return out


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"
    }


class _TensorBoard:
    def __init__(self, out: Path, config: Any):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / TB_DIR))

    def add(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, out: Path, config: Any):
        import wandb

        mode = os.environ.get("WANDB_MODE") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline"
        )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rpeg"),
            dir=str(out),
            mode=mode,
            config=config.model_dump(mode="json"),
        )

    def add(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class _Mlflow:
    def __init__(self, out: Path, config: Any):
        from mlflow.tracking import MlflowClient

        out.mkdir(parents=True, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(out / MLFLOW_DB).resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name("rpeg")
        exp_id = exp.experiment_id if exp else self.client.create_experiment("rpeg")
        self.run_id = self.client.create_run(exp_id).info.run_id

    def add(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.client.log_metric(self.run_id, k, v, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_KINDS = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


class RunLoggers:
    """The loggers ``runtime.loggers`` names, opened on ``out``. A default TensorBoard that
    fails to open writes nothing and fails nothing (as a trimmed install)."""

    def __init__(self, out: str | Path, config: Any = None, names: Sequence[str] | None = None):
        out = Path(out)
        self.loggers: list[Any] = []
        explicit = config is not None and config.runtime.loggers is not None
        for name in logger_names(config) if names is None else names:
            try:
                self.loggers.append(_KINDS[name](out, config))
            except Exception:  # noqa: BLE001 -- only the unasked-for default may be skipped
                if explicit:
                    raise

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        """``step``: 1-based, as the console counts."""
        values = _numeric(metrics)
        for lg in self.loggers:
            lg.add(step, values)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()
