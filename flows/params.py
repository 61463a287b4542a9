"""Typed parameters of the operations flows, so the Prefect UI renders a form.

A flow that takes one of these models as its single parameter (``params``) gets a JSON
schema with types, ranges and descriptions; the Prefect server validates a run's parameters
against it (deployments are created with ``enforce_parameter_schema=True``) and the flow
validates them again with pydantic when it starts. :meth:`TrainParams.resolve` then loads the
run configuration and applies the overrides, raising :class:`rpeg.errors.ConfigError` with
every problem *before* any Dask actor starts.

Models
------
* :class:`TrainParams` -- one training run (flow ``rpeg-train``): a config path or fsspec URL
  plus overrides (steps, staleness, learning rate, cluster address, checkpoint URL, resume).
* :class:`RetrainParams` -- the scheduled retraining flow ``retrain``: newest data under an
  fsspec glob, N more steps from the latest checkpoint, promotion rule.

This module imports no prefect, torch or dask (pure pydantic), so the CLI and the tests can
use it cheaply.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, Problem

# tcp://host:port, tls://..., ucx://..., inproc://... (what distributed.Client accepts)
CLUSTER_ADDRESS_PATTERN = r"^(tcp|tls|ucx|ucxx|inproc|ws|wss)://[^\s/]+(:\d+)?/?$"


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    config: str = Field(
        ...,
        min_length=1,
        title="Run config",
        description="Path (absolute on the worker's machine) or fsspec URL (s3://, gs://, "
        "memory://) of the run YAML. Everything not overridden below comes from it.",
        examples=["/abs/path/my-run.yaml", "s3://bucket/runs/my-run.yaml"],
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        le=64,
        title="Max staleness (k)",
        description="bound on policy-version lag; empty = from the config",
    )
    lr: float | None = Field(
        None, gt=0.0, le=1.0, title="Learning rate", description="empty = from the config"
    )
    cluster_address: str | None = Field(
        None,
        pattern=CLUSTER_ADDRESS_PATTERN,
        title="Dask scheduler",
        description="existing Dask scheduler such as tcp://10.0.0.5:8786; empty = the config's "
        "cluster.address, else a LocalCluster on the worker's machine",
    )
    checkpoint_url: str | None = Field(
        None,
        min_length=1,
        title="Checkpoint URL",
        description="fsspec URL for checkpoints; empty = from the config",
    )
    output_dir: str | None = Field(
        None, min_length=1, description="metrics/plots folder; empty = from the config"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        title="More overrides",
        description='dotted config overrides, e.g. {"workload.num_prompts": 8}',
    )

    @field_validator("overrides")
    @classmethod
    def _dotted(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in v if not k or "." not in k or any(not p for p in k.split("."))]
        if bad:
            raise ValueError(f"override keys must be dotted section.field names (got {bad})")
        return v

    # ------------------------------------------------------------------ config
    def config_overrides(self) -> dict[str, Any]:
        """The dotted overrides these parameters apply to the run config."""
        out: dict[str, Any] = dict(self.overrides)
        if self.max_staleness is not None:
            out["runtime.max_staleness"] = self.max_staleness
        if self.lr is not None:
            out["optim.lr"] = self.lr
        if self.cluster_address is not None:
            out["cluster.address"] = self.cluster_address
        if self.checkpoint_url is not None:
            out["runtime.checkpoint_url"] = self.checkpoint_url
        if self.output_dir is not None:
            out["runtime.output_dir"] = self.output_dir
        return out

    def load_base(self) -> RunConfig:
        return RunConfig.from_yaml(self.config)


class TrainParams(_Params):
    """Parameters of one training run started from the UI, the CLI or the REST API."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, title="rl_train parameters")

    steps: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        title="Steps",
        description="total RL steps (a resumed run continues to this step)",
    )
    resume: bool = Field(
        False, title="Resume", description="continue from the latest complete checkpoint"
    )

    def config_overrides(self) -> dict[str, Any]:
        out = super().config_overrides()
        if self.steps is not None:
            out["runtime.steps"] = self.steps
        if self.resume:
            out["runtime.resume"] = True
        return out

    def resolve(self) -> RunConfig:
        """Load the config and apply the overrides; ConfigError lists every problem."""
        cfg = self.load_base()
        return cfg.with_overrides(self.config_overrides())


class RetrainParams(_Params):
    """Parameters of the scheduled retraining flow ``retrain``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, title="retrain parameters")

    data_glob: str | None = Field(
        None,
        min_length=1,
        title="Data glob",
        description="fsspec glob of training files (*.jsonl or *.parquet), e.g. s3://bucket/gsm/*.jsonl; "
        "the newest match becomes task.url. Empty = keep the config's task.",
    )
    newest_by: Literal["mtime", "name"] = Field(
        "mtime",
        description="how 'newest' is decided: modification time (ties by name) or the largest name",
    )
    steps: int = Field(
        10,
        ge=1,
        le=1_000_000,
        title="Steps",
        description="RL steps to train beyond the latest checkpoint",
    )
    tolerance: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="promote when score >= previous latest-good score - tolerance",
    )
    engine: Literal["dask", "local"] = Field(
        "dask",
        description="dask: run_train (rl_train on Dask actors); local: the single-process trainer "
        "in the flow process (small models, CI)",
    )
    train_timeout_s: float = Field(
        6 * 3600.0, gt=0, description="timeout of the training task (it is retried once, resuming)"
    )
    keep_promoted: bool = Field(
        True,
        description="copy the promoted checkpoint to <checkpoint_url>/latest-good/ so pruning "
        "(runtime.keep_last) never deletes it",
    )

    def resolve(self, *, base_step: int = 0, data_url: str | None = None) -> RunConfig:
        """The config for one retraining round: ``steps`` beyond ``base_step`` with resume on;
        ``data_url`` (the newest file) as the task; ConfigError lists every problem."""
        cfg = self.load_base()
        over = self.config_overrides()
        over["runtime.steps"] = base_step + self.steps
        over["runtime.resume"] = base_step > 0
        if data_url is not None:
            over["task.url"] = data_url
            over["task.kind"] = "parquet" if data_url.endswith(".parquet") else "jsonl"
        cfg = cfg.with_overrides(over)
        if not cfg.runtime.checkpoint_url:
            raise ConfigError(
                [
                    Problem(
                        "runtime.checkpoint_url",
                        "retrain needs a checkpoint URL (config or the checkpoint_url parameter)",
                    )
                ],
                title="retrain parameters refused",
            )
        return cfg


def parse_param_assignments(items: list[str] | None) -> dict[str, Any]:
    """CLI helper: ``["steps=5", "lr=1e-5", "overrides={\\"a.b\\": 1}"]`` -> dict (values as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    problems = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(Problem(item, "expected NAME=VALUE"))
            continue
        v = yaml.safe_load(value) if value.strip() else None
        if isinstance(v, str):  # YAML 1.1 reads 1e-5 as a string
            with contextlib.suppress(ValueError):
                v = float(v)
        out[key.strip()] = v
    if problems:
        raise ConfigError(problems, title="invalid --param")
    return out


__all__ = ["CLUSTER_ADDRESS_PATTERN", "RetrainParams", "TrainParams", "parse_param_assignments"]
