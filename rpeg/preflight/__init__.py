"""One validation pass before anything starts (no Prefect, no Dask, no model load).

:func:`preflight` checks a :class:`rpeg.config.RunConfig` against everything a run will
touch and raises one :class:`rpeg.errors.ConfigError` listing *every* problem found (the
CLI prints it and exits 2, without a traceback):

* the model: ``model.name`` in the catalog (the names are listed), the built-in tiny
  model unless ``model.path`` is set, ``model.path`` / ``critic_path`` folders that exist
  and hold a ``config.json``;
* the algorithm: a group baseline (GRPO, RLOO) with at least 2 samples per prompt;
* the task: every reward name registered, the data file (every bad row, up to
  :data:`rpeg.runtime.data.MAX_ROW_PROBLEMS`, e.g. a JSONL line ``[1,2]``), the prompt
  template's placeholders;
* places: ``runtime.output_dir``, ``runtime.checkpoint_url`` and files the command writes
  at the end (``--summary-json``) writable, ``--resume`` / ``--resume-from`` pointing at a
  usable checkpoint;
* the machine: local device and worker counts against the CPUs (or GPUs) here, a
  ``tls://`` scheduler with its certificate files, an existing scheduler's port accepting
  connections (:func:`check_scheduler_reachable`), the dashboard address and worker memory;
* the plan: the compiled step (:func:`rpeg.compile.compile_plan`), whose problems join the
  list.

The config's own schema (types, ranges, finite numbers, unknown keys) is validated when it is
loaded (:meth:`RunConfig.from_dict`), also all at once; :func:`load_config` adds an inline
plan's problems to those, so a config with both kinds lists both. This module imports no torch, dask or
prefect at module level; its checks are cheap reads (the data file is read once).

What each module holds: ``before_start`` (the pass and :func:`load_config`), ``inputs``
(model, engine, algorithm, task), ``places`` (output folder, checkpoints, resume), ``machine``
(devices, workers, scheduler, dashboard, memory), ``gpus`` (a GPU plan against the workers'
GPUs).
"""

from rpeg.preflight.before_start import (
    load_config,
    preflight,
)
from rpeg.preflight.gpus import (
    check_plan_devices,
    plan_gpus,
)
from rpeg.preflight.inputs import (
    GROUP_BASELINES,
    TINY_MODEL,
    check_algorithm,
    check_generation_engine,
    check_model,
    check_task,
)
from rpeg.preflight.machine import (
    SCHEDULER_PROBE_S,
    check_machine,
    check_scheduler_reachable,
    machine_cpus,
    machine_device_limit,
)
from rpeg.preflight.places import (
    check_file_writable,
    check_places,
    check_resumed_layout,
)

__all__ = [
    "GROUP_BASELINES",
    "SCHEDULER_PROBE_S",
    "TINY_MODEL",
    "check_algorithm",
    "check_file_writable",
    "check_generation_engine",
    "check_machine",
    "check_model",
    "check_places",
    "check_plan_devices",
    "check_resumed_layout",
    "check_scheduler_reachable",
    "check_task",
    "load_config",
    "machine_cpus",
    "machine_device_limit",
    "plan_gpus",
    "preflight",
]
