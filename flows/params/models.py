"""The flows' parameter models (:class:`TrainParams`, :class:`RetrainParams`: field order is
the form's order) and how they become a run config (:func:`load_config` + the overrides)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rpeg.flows.params.fields import (
    D_K,
    D_LR,
    D_PROMPTS,
    D_RETRAIN_STEPS,
    D_SAMPLES,
    D_STEPS,
    D_TIMEOUT_S,
    CheckpointUrl,
    ClusterAddress,
    ConfigPath,
    DataGlob,
    Engine,
    KeepPromoted,
    LearningRate,
    MaxStaleness,
    NewestBy,
    NumPrompts,
    OutputDir,
    Overrides,
    Resume,
    RetrainSteps,
    SamplesPerPrompt,
    Steps,
    Tolerance,
    TrainTimeout,
)

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, Problem


class BaseParams(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("overrides", check_fields=False)
    @classmethod
    def _dotted(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in v if not k or "." not in k or any(not p for p in k.split("."))]
        if bad:
            raise ValueError(f"keys must be dotted section.field names (got {bad})")
        return v

    # ------------------------------------------------------------------ config
    def config_overrides(self) -> dict[str, Any]:
        """The dotted overrides these parameters apply to the run config."""
        out: dict[str, Any] = dict(self.overrides)
        out["optim.lr"] = self.lr
        out["runtime.max_staleness"] = self.max_staleness
        if self.cluster_address:
            out["cluster.address"] = self.cluster_address
        if self.checkpoint_url:
            out["runtime.checkpoint_url"] = self.checkpoint_url
        return out

    def load_base(self) -> RunConfig:
        return load_config(self.config)

    def config_label(self) -> str:
        """A short name of the config for run names: the file's stem, or ``builtin``."""
        if not self.config:
            return "builtin"
        stem = Path(self.config.rstrip("/").rsplit("/", 1)[-1]).stem
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-") or "config"


class TrainParams(BaseParams):
    """Parameters of one training run (flow ``train``), in form order."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, title="train parameters")

    steps: Steps = D_STEPS
    lr: LearningRate = D_LR
    max_staleness: MaxStaleness = D_K
    num_prompts: NumPrompts = D_PROMPTS
    samples_per_prompt: SamplesPerPrompt = D_SAMPLES
    resume: Resume = False
    config: ConfigPath = ""
    checkpoint_url: CheckpointUrl = ""
    output_dir: OutputDir = ""
    cluster_address: ClusterAddress = ""
    overrides: Overrides = Field(default_factory=dict)

    def config_overrides(self) -> dict[str, Any]:
        out = super().config_overrides()
        out["runtime.steps"] = self.steps
        out["workload.num_prompts"] = self.num_prompts
        out["workload.samples_per_prompt"] = self.samples_per_prompt
        if self.resume:
            out["runtime.resume"] = True
        return out

    def resolve(self) -> RunConfig:
        """Load the config and apply the parameters; ConfigError lists every problem."""
        return self.load_base().with_overrides(self.config_overrides())


class RetrainParams(BaseParams):
    """Parameters of the scheduled retraining flow ``retrain``, in form order."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, title="retrain parameters")

    steps: RetrainSteps = D_RETRAIN_STEPS
    data_glob: DataGlob = ""
    lr: LearningRate = D_LR
    max_staleness: MaxStaleness = D_K
    tolerance: Tolerance = 0.0
    config: ConfigPath = ""
    checkpoint_url: CheckpointUrl = ""
    output_dir: OutputDir = ""
    newest_by: NewestBy = "mtime"
    engine: Engine = "dask"
    train_timeout_s: TrainTimeout = D_TIMEOUT_S
    keep_promoted: KeepPromoted = True
    cluster_address: ClusterAddress = ""
    overrides: Overrides = Field(default_factory=dict)

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
                        "checkpoint_url",
                        "retrain needs a checkpoint URL (in the config or this parameter)",
                    )
                ],
                title="retrain parameters refused",
            )
        return cfg


# ---------------------------------------------------------------------- helpers
def load_config(path: str) -> RunConfig:
    """The run config at ``path`` (empty = the built-in defaults). A missing file is one
    ConfigError line naming the path and the working directory, not a traceback."""
    if not path:
        return RunConfig()
    if "://" not in path and "\n" not in path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(
                [Problem("config", f"no such file: {path} (working directory {Path.cwd()})")],
                title="run config not found",
            )
        path = str(p)
    from rpeg.preflight import load_config as load_checked

    return load_checked(path)
