"""The one typed run configuration.

Every default of a run is written once, in this package's section modules (``algorithm``:
the algorithm and the optimizer; ``workload``: the model, one step's workload, the task;
``execution``: cluster, runtime, plan search); :class:`RunConfig` (``run``) holds them all,
and the other layers read their defaults from it rather than writing their own
(tests/test_one_default.py checks the main knobs). Units are in the names (``num_prompts``,
``samples_per_prompt``, ``max_response_tokens``). Configs load from YAML (a path or any
fsspec URL; ``yaml_io``) and dump back to YAML; every error in a config is reported at once,
as a :class:`rpeg.errors.ConfigError` whose problems name the dotted field and the allowed
values.

Import the names from here (``from rpeg.config import RunConfig``). This package is pure: no
torch, dask or prefect.
"""

from rpeg.config.algorithm import (
    ROLLOUT_CORRECTION_BOUNDS,
    AlgorithmConfig,
    AlgorithmName,
    KLEstimator,
    LossAggregation,
    OptimConfig,
    RolloutCorrectionConfig,
    RolloutCorrectionMode,
)
from rpeg.config.execution import (
    MAX_DEVICES,
    ClusterConfig,
    RuntimeConfig,
    SearchConfig,
    SlurmConfig,
)
from rpeg.config.run import RunConfig, problems_from_pydantic
from rpeg.config.section import Section
from rpeg.config.workload import (
    TINY_LINEAR_MODULES,
    EnvName,
    LoraSection,
    ModelConfig,
    MultiTurnConfig,
    Precision,
    TaskConfig,
    ToolName,
    WorkloadConfig,
)
from rpeg.config.yaml_io import MAX_YAML_ALIASES, MAX_YAML_BYTES, read_text_or_path, safe_yaml

__all__ = [
    "MAX_DEVICES",
    "MAX_YAML_ALIASES",
    "MAX_YAML_BYTES",
    "ROLLOUT_CORRECTION_BOUNDS",
    "AlgorithmConfig",
    "AlgorithmName",
    "ClusterConfig",
    "EnvName",
    "KLEstimator",
    "LossAggregation",
    "LoraSection",
    "ModelConfig",
    "TINY_LINEAR_MODULES",
    "MultiTurnConfig",
    "OptimConfig",
    "Precision",
    "RolloutCorrectionConfig",
    "RolloutCorrectionMode",
    "RunConfig",
    "RuntimeConfig",
    "SearchConfig",
    "SlurmConfig",
    "Section",
    "TaskConfig",
    "ToolName",
    "WorkloadConfig",
    "problems_from_pydantic",
    "read_text_or_path",
    "safe_yaml",
]
