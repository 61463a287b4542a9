"""Typed parameters of the deployable flows, so the Prefect UI renders a clean form.

The flows ``train`` and ``retrain`` take *flat* parameters (one form field each, so a run
started with ``--param steps=50`` or a REST body ``{"steps": 50}`` is merged with the
deployment's other defaults by Prefect). Each field is declared once here as an
``Annotated`` type carrying its range, unit, title and description; the pydantic models
:class:`TrainParams` and :class:`RetrainParams` and the flow signatures use the same types,
and the models' field order is the form's order (the most-changed fields first).

Every field is non-nullable and has a default: numbers default to rpeg/config.py's defaults
(the one place defaults live); ``rpeg deploy CONFIG`` fills the deployment's defaults with
CONFIG's values (:func:`form_defaults`), so the form shows what the config would run. Text
fields use the empty string for "as in the config".

The flows validate their parameters themselves when they start (:func:`validate_params`),
also when a run was created with the UI's "Validate parameters" switch off: a refused run
logs one ERROR line, publishes a ``refused`` artifact and ends Failed with the reason.

This module imports no prefect, torch or dask (pure pydantic), so the CLI and the tests can
use it cheaply.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, Problem

# tcp://host:port, tls://..., ucx://..., inproc://... (what distributed.Client accepts)
CLUSTER_ADDRESS_PATTERN = r"^(tcp|tls|ucx|ucxx|inproc|ws|wss)://[^\s/]+(:\d+)?/?$"
_DEFAULTS = RunConfig()  # rpeg/config.py: the defaults of every numeric field below


def ui_field(title: str, description: str, **constraints: Any) -> Any:
    """A pydantic ``Field`` whose title and description survive Prefect's flow-signature
    schema (Prefect overwrites a parameter's ``title`` with its name and drops the
    ``description`` of an ``Annotated`` field; ``json_schema_extra`` is kept)."""
    return Field(
        title=title,
        description=description,
        json_schema_extra={"title": title, "description": description},
        **constraints,
    )


# ------------------------------------------------------------------ the fields, once
Steps = Annotated[
    int,
    ui_field(
        "Steps",
        "RL steps in total, 1 to 10,000,000 (a resumed run continues up to this step).",
        ge=1,
        le=10_000_000,
    ),
]
RetrainSteps = Annotated[
    int,
    ui_field(
        "Steps (beyond the latest checkpoint)",
        "RL steps this round trains after the newest complete checkpoint, 1 to 1,000,000.",
        ge=1,
        le=1_000_000,
    ),
]
LearningRate = Annotated[
    float,
    ui_field(
        "Learning rate",
        "Adam learning rate of the policy (optim.lr), greater than 0 and at most 1, e.g. 1e-4.",
        gt=0.0,
        le=1.0,
    ),
]
MaxStaleness = Annotated[
    int,
    ui_field(
        "Max staleness k (policy versions)",
        "How many policy versions rollouts may lag behind training, 0 (on-policy) to 64.",
        ge=0,
        le=64,
    ),
]
NumPrompts = Annotated[
    int,
    ui_field(
        "Prompts per step",
        "Prompts sampled per RL step (workload.num_prompts), 1 to 100,000.",
        ge=1,
        le=100_000,
    ),
]
SamplesPerPrompt = Annotated[
    int,
    ui_field(
        "Samples per prompt",
        "Responses generated per prompt, the GRPO group (workload.samples_per_prompt), 1 to 1024.",
        ge=1,
        le=1024,
    ),
]
Resume = Annotated[
    bool,
    ui_field("Resume", "Continue from the newest complete checkpoint under the checkpoint URL."),
]
ConfigPath = Annotated[
    str,
    ui_field(
        "Run config (YAML path or URL)",
        "YAML file on the worker's machine (absolute, or relative to its working directory) "
        "or an fsspec URL such as s3://bucket/run.yaml. Empty: the built-in task. Fields not "
        "in this form come from it.",
        max_length=4096,
    ),
]
CheckpointUrl = Annotated[
    str,
    ui_field(
        "Checkpoint URL",
        "Folder or fsspec URL for checkpoints (runtime.checkpoint_url). Empty: as in the config.",
        max_length=4096,
    ),
]
OutputDir = Annotated[
    str,
    ui_field(
        "Output folder",
        "Each run writes metrics and pictures to `FOLDER/RUN-NAME/` and points "
        "`FOLDER/latest` at it. Empty: the folder of the config's `runtime.output_dir`.",
        max_length=4096,
    ),
]
ClusterAddress = Annotated[
    str,
    ui_field(
        "Dask scheduler address",
        "An existing Dask scheduler, e.g. tcp://10.0.0.5:8786. Empty: the config's "
        "cluster.address, else a LocalCluster on the worker's machine.",
        pattern=f"^$|{CLUSTER_ADDRESS_PATTERN}",
        max_length=512,
    ),
]
Overrides = Annotated[
    dict[str, Any],
    ui_field(
        "More overrides",
        'Any other config field as `{"section.field": value}`, e.g. '
        '`{"workload.max_response_tokens": 64}`.',
    ),
]
DataGlob = Annotated[
    str,
    ui_field(
        "Data glob",
        "fsspec glob of training files (`*.jsonl` or `*.parquet`), e.g. "
        "`s3://bucket/gsm/*.jsonl`; the newest match becomes `task.url`. Empty: keep the "
        "config's task.",
        max_length=4096,
    ),
]
NewestBy = Annotated[
    Literal["mtime", "name"],
    ui_field(
        "Newest file by",
        "mtime: modification time (ties by name); name: the largest name (dated names).",
    ),
]
Tolerance = Annotated[
    float,
    ui_field(
        "Promotion tolerance (accuracy points, 0 to 1)",
        "Promote when the held-out accuracy is at least the previous latest-good accuracy "
        "minus this.",
        ge=0.0,
        le=1.0,
    ),
]
Engine = Annotated[
    Literal["dask", "local"],
    ui_field(
        "Engine",
        "dask: Dask actors (the training flow's engine); local: the single-process trainer "
        "inside the flow process (small models, CI).",
    ),
]
TrainTimeout = Annotated[
    float,
    ui_field(
        "Training timeout (seconds)",
        "Timeout of the training task, more than 0 s; the task is retried once and the retry "
        "resumes from the newest checkpoint. Default 21600 s = 6 h.",
        gt=0.0,
        le=30 * 24 * 3600.0,
    ),
]
KeepPromoted = Annotated[
    bool,
    ui_field(
        "Keep the promoted checkpoint",
        "Copy the promoted checkpoint to `CHECKPOINT-URL/latest-good/` so pruning "
        "(`runtime.keep_last`) never deletes it.",
    ),
]

# defaults (the flows' signatures use the same values)
D_STEPS = _DEFAULTS.runtime.steps
D_LR = _DEFAULTS.optim.lr
D_K = _DEFAULTS.runtime.max_staleness
D_PROMPTS = _DEFAULTS.workload.num_prompts
D_SAMPLES = _DEFAULTS.workload.samples_per_prompt
D_RETRAIN_STEPS = 10
D_TIMEOUT_S = 6 * 3600.0


class _Params(BaseModel):
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


class TrainParams(_Params):
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


class RetrainParams(_Params):
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
    from rpeg.preflight import load_config

    return load_config(path)


def _explain(err: dict[str, Any], model: type[BaseModel]) -> Problem:
    """One pydantic error as ``Title (name): what is allowed (got X)``."""
    loc = [str(p) for p in err.get("loc", ())]
    name = loc[0] if loc else ""
    info = model.model_fields.get(name)
    title = (info.title if info is not None else None) or name
    where = f"{title} ({name})" if title != name else name
    got = err.get("input")
    ctx = err.get("ctx") or {}
    t = err["type"]
    bounds = {
        "greater_than_equal": "at least {ge}",
        "greater_than": "more than {gt}",
        "less_than_equal": "at most {le}",
        "less_than": "less than {lt}",
    }
    if t in bounds:
        what = "must be " + bounds[t].format(**ctx)
    elif t in ("int_type", "int_parsing", "int_from_float"):
        what = "must be a whole number"
    elif t in ("float_type", "float_parsing", "finite_number"):
        what = "must be a finite number"
    elif t in ("bool_type", "bool_parsing"):
        what = "must be true or false"
    elif t == "string_pattern_mismatch" and name == "cluster_address":
        what = "must look like tcp://host:port (or tls://, ucx://), or be empty"
    elif t == "literal_error":
        what = f"must be one of {ctx.get('expected')}"
    elif t == "extra_forbidden":
        allowed = ", ".join(model.model_fields)
        return Problem(name, f"unknown parameter; the parameters are: {allowed}")
    elif t == "missing":
        return Problem(where, "is required")
    else:
        what = err.get("msg", t)
        if what.startswith("Value error, "):
            return Problem(where, what[len("Value error, ") :])
    if len(loc) > 1:
        where += " " + ".".join(loc[1:])
    return Problem(where, f"{what} (got {got!r})")


def validate_params(model: type[_Params], values: dict[str, Any]) -> Any:
    """``model`` from ``values``; ConfigError with one human line per bad field."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(
            [_explain(e, model) for e in exc.errors()], title="parameters refused"
        ) from None


def one_line(exc: BaseException) -> str:
    """An error as one line (``title: problem; problem``) for a log line or a state message."""
    problems = getattr(exc, "problems", None)
    if problems:
        title = getattr(exc, "title", "refused")
        return f"{title}: " + "; ".join(str(p) for p in problems)
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def form_defaults(model: type[_Params], config: str, **given: Any) -> dict[str, Any]:
    """Deployment defaults for ``model``'s form: the config's own values for the numeric
    fields (so the form shows what the config runs), then ``given``; validated."""
    cfg = load_config(config)
    from_cfg = {
        "lr": cfg.optim.lr,
        "max_staleness": cfg.runtime.max_staleness,
        "steps": cfg.runtime.steps,
        "num_prompts": cfg.workload.num_prompts,
        "samples_per_prompt": cfg.workload.samples_per_prompt,
    }
    values = {k: v for k, v in from_cfg.items() if k in model.model_fields}
    if model is RetrainParams:
        values.pop("steps")
    values.update({"config": config, **given})
    p = validate_params(model, values)
    return p.model_dump(mode="json")


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
        v = yaml.safe_load(value) if value.strip() else ""
        if isinstance(v, str):  # YAML 1.1 reads 1e-5 as a string
            with contextlib.suppress(ValueError):
                v = float(v)
        out[key.strip()] = v
    if problems:
        raise ConfigError(problems, title="invalid --param")
    return out


__all__ = [
    "CLUSTER_ADDRESS_PATTERN",
    "RetrainParams",
    "TrainParams",
    "form_defaults",
    "load_config",
    "one_line",
    "parse_param_assignments",
    "ui_field",
    "validate_params",
]
