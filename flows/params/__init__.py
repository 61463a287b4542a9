"""Typed parameters of the deployable flows, so the Prefect UI renders a clean form.

The flows ``train`` and ``retrain`` take *flat* parameters (one form field each, so a run
started with ``--param steps=50`` or a REST body ``{"steps": 50}`` is merged with the
deployment's other defaults by Prefect). Each field is declared once here as an
``Annotated`` type carrying its range, unit, title and description; the pydantic models
:class:`TrainParams` and :class:`RetrainParams` and the flow signatures use the same types,
and the models' field order is the form's order (the most-changed fields first).

Every field is non-nullable and has a default: numbers default to the run config's
(:class:`rpeg.config.RunConfig`, where a run's defaults are written); ``rpeg deploy CONFIG`` fills the deployment's defaults with
CONFIG's values (:func:`form_defaults`), so the form shows what the config would run. Text
fields use the empty string for "as in the config".

The flows validate their parameters themselves when they start (:func:`validate_params`),
also when a run was created with the UI's "Validate parameters" switch off: a refused run
logs one ERROR line, publishes a ``refused`` artifact and ends Failed with the reason.

This module imports no prefect, torch or dask (pure pydantic), so the CLI and the tests can
use it cheaply.

What each module holds: ``fields`` (the form fields and their defaults), ``models`` (the
parameter models and the config they resolve to), ``checks`` (validation messages, form
defaults, ``--param`` parsing).
"""

from rpeg.flows.params.checks import (
    form_defaults,
    one_line,
    parse_param_assignments,
    validate_params,
)
from rpeg.flows.params.fields import (
    CLUSTER_ADDRESS_PATTERN,
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
    ui_field,
)
from rpeg.flows.params.models import (
    RetrainParams,
    TrainParams,
    load_config,
)

__all__ = [
    "CLUSTER_ADDRESS_PATTERN",
    "CheckpointUrl",
    "ClusterAddress",
    "ConfigPath",
    "D_K",
    "D_LR",
    "D_PROMPTS",
    "D_RETRAIN_STEPS",
    "D_SAMPLES",
    "D_STEPS",
    "D_TIMEOUT_S",
    "DataGlob",
    "Engine",
    "KeepPromoted",
    "LearningRate",
    "MaxStaleness",
    "NewestBy",
    "NumPrompts",
    "OutputDir",
    "Overrides",
    "Resume",
    "RetrainParams",
    "RetrainSteps",
    "SamplesPerPrompt",
    "Steps",
    "Tolerance",
    "TrainParams",
    "TrainTimeout",
    "form_defaults",
    "load_config",
    "one_line",
    "parse_param_assignments",
    "ui_field",
    "validate_params",
]
