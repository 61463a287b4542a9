"""The form fields of the deployable flows, each declared once as an ``Annotated`` type
carrying its range, unit, title and description, and the numeric fields' defaults (taken from
rpeg/config/'s :class:`RunConfig`, so each default is written once)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rpeg.config import RunConfig

# tcp://host:port, tls://..., ucx://..., inproc://... (what distributed.Client accepts)
CLUSTER_ADDRESS_PATTERN = r"^(tcp|tls|ucx|ucxx|inproc|ws|wss)://[^\s/]+(:\d+)?/?$"
_DEFAULTS = RunConfig()  # rpeg/config/: the defaults of every numeric field below


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
