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
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, Problem, ProblemsError
from rpeg.ir.recipes import RECIPES

#: the built-in model (trained when ``model.path`` is None)
TINY_MODEL = "rpeg-tiny"
_SIZE = re.compile(r"^\s*(auto|none|0|\d+(\.\d+)?\s*([kKMGTP]i?B|B)?)\s*$")
_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):\d{1,5}$")


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity; ``os.cpu_count`` off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_device_limit(device_type: str = "cpu") -> int:
    """How many local devices this machine can host: its CPUs (at least 4: the shipped
    configs/sharded-cpu.yaml and async-cpu.yaml run four one-thread workers, slower but
    correct on a 2-core machine), or its CUDA GPUs."""
    if device_type == "cuda":
        from rpeg.infra.cluster import cuda_device_count

        return cuda_device_count()
    return max(4, machine_cpus())


def load_config(source: str | None) -> RunConfig:
    """The run config at ``source`` (a path, an fsspec URL or YAML text; None: the defaults).
    When it has problems and its ``plan`` section is inline, the plan's own problems (its
    schema and layout rules, as ``plan.<field>``) join them in the one error: otherwise a
    user would fix the config and only then learn of the plan's."""
    if source is None:
        return RunConfig()
    try:
        return RunConfig.from_yaml(source)
    except ConfigError as exc:
        extra = _inline_plan_problems(source)
        if not extra:
            raise
        raise ConfigError([*exc.problems, *extra], title=exc.title) from None


def _inline_plan_problems(source: str) -> list[Problem]:
    """Problems of the inline ``plan`` mapping of the YAML at ``source`` ([] if none)."""
    import yaml

    from rpeg.config import read_text_or_path, safe_yaml
    from rpeg.plan import Plan

    try:
        data = safe_yaml(read_text_or_path(source)[0])
    except (ConfigError, yaml.YAMLError):
        return []
    plan = data.get("plan") if isinstance(data, dict) else None
    if not isinstance(plan, dict):
        return []
    try:
        Plan.from_dict(plan)
    except ConfigError as exc:
        return [Problem(f"plan.{p.where}", p.what) for p in exc.problems]
    return []


def preflight(
    config: RunConfig,
    *,
    cluster_devices: int | None = None,
    local: bool = False,
    compile_plan: bool = True,
    output_files: dict[str, str | None] | None = None,
) -> Any:
    """Check everything; raise ConfigError listing all problems. Returns the compiled step
    (None with ``local`` or ``compile_plan=False``). ``cluster_devices``: the devices of an
    existing cluster (None = a LocalCluster on this machine). ``output_files``: files the
    command writes at the end (``{"--summary-json": path}``), checked writable now."""
    problems: list[Problem] = []
    for where, path in (output_files or {}).items():
        if path:
            problems += check_file_writable(path, where)
    problems += check_model(config)
    problems += check_algorithm(config)
    problems += check_task(config)
    problems += check_places(config, local)
    problems += check_generation_engine(config)
    from rpeg.runtime.loggers import logger_problems

    problems += logger_problems(config)
    if not local:
        problems += check_machine(config, cluster_devices=cluster_devices)
        problems += check_scheduler_reachable(config.cluster.address)
    compiled = None
    if compile_plan and not local:
        from rpeg.compile import compile_plan as _compile

        try:
            compiled = _compile(None, config, cluster_devices=cluster_devices)
        except ProblemsError as exc:
            problems += list(exc.problems)
        if compiled is not None and not problems:
            problems += check_resumed_layout(config, compiled)
        if compiled is not None and config.cluster.address is None and cluster_devices is None:
            # a LocalCluster's workers see this machine's GPUs
            from rpeg.infra.devices import device_view

            if plan_gpus(compiled):
                views = {"local": device_view()}
                problems += check_plan_devices(config, compiled, views, per_worker=False)
    if problems:
        raise ConfigError(problems, title="run refused before anything started")
    return compiled


def check_generation_engine(config: RunConfig) -> list[Problem]:
    """``runtime.engine: vllm`` needs vLLM in this Python (on a CPU machine: the environment
    ``bash scripts/vllm_env.sh DIR`` builds); an untested vLLM release is a warning naming
    both versions (rpeg.runtime.engines.choice)."""
    if config.runtime.engine != "vllm":
        return []
    import sys
    import warnings

    from rpeg.runtime.engines.choice import VLLM_INSTALL, vllm_importable, vllm_version_warning

    if not vllm_importable():
        return [
            Problem(
                "runtime.engine",
                f"vllm is not installed in this Python ({sys.executable}): {VLLM_INSTALL} "
                "builds a virtual environment with vLLM's CPU build and the project (run "
                "DIR/bin/rpeg there); on CUDA machines pip install 'rpeg[gpu]'; or use "
                "runtime.engine: torch",
            )
        ]
    msg = vllm_version_warning()
    if msg:
        warnings.warn(msg, stacklevel=2)
    return []


# ------------------------------------------------------------------------------ model
def check_model(config: RunConfig) -> list[Problem]:
    from rpeg import specs

    m = config.model
    out: list[Problem] = []
    names = sorted(specs.models())
    if m.name not in names:
        out.append(Problem("model.name", f"unknown model {m.name!r}; known: {', '.join(names)}"))
    elif m.path is None and m.name != TINY_MODEL:
        out.append(
            Problem(
                "model.name",
                f"{m.name!r} has no weights here: set model.path to its Hugging Face folder "
                f"(without model.path the built-in {TINY_MODEL!r} is trained)",
            )
        )
    for field in ("path", "critic_path", "reward_model_path"):
        url = getattr(m, field)
        if url:
            out += _check_model_folder(url, f"model.{field}")
    return out


def _check_model_folder(url: str, where: str) -> list[Problem]:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url)
        if not fs.exists(root):
            return [Problem(where, f"{url!r} does not exist")]
        if not fs.isdir(root):
            return [Problem(where, f"{url!r} is not a folder (a Hugging Face model folder)")]
        if not fs.exists(f"{root.rstrip('/')}/config.json"):
            return [Problem(where, f"{url!r} holds no config.json (not a Hugging Face model)")]
    except Exception as exc:  # noqa: BLE001 - any failure to look is a problem to report
        return [Problem(where, f"{url!r} cannot be read: {type(exc).__name__}: {exc}")]
    return []


# ------------------------------------------------------------------------------ algorithm
#: algorithms whose advantage compares a sample with the other samples of its prompt
GROUP_BASELINES = tuple(n for n, r in RECIPES.items() if r.group_baseline)


def check_algorithm(config: RunConfig) -> list[Problem]:
    """A group baseline needs a group: GRPO's advantage with one sample per prompt is 0 for
    every sample (the run would train on its KL and entropy terms alone), RLOO's has no
    other sample to leave out (verl refuses GRPO with ``rollout.n`` = 1 likewise)."""
    a, k = config.algorithm.name, config.workload.samples_per_prompt
    if a in GROUP_BASELINES and k < 2:
        return [
            Problem(
                "workload.samples_per_prompt",
                f"{a} needs at least 2 samples per prompt (got {k}): its advantage compares "
                "each sample with the other samples of its prompt; or use algorithm.name "
                "reinforce_pp or ppo, which need no group",
            )
        ]
    return []


# ------------------------------------------------------------------------------ task
def check_task(config: RunConfig) -> list[Problem]:
    from rpeg.runtime.data import check_template
    from rpeg.runtime.datasets.files import check_examples
    from rpeg.runtime.rewards import load_reward_modules, registered_rewards

    t = config.task
    out: list[Problem] = load_reward_modules(t.reward_modules)  # their rewards register now
    known = registered_rewards()
    for i, name in enumerate(t.rewards):
        if name not in known:
            out.append(
                Problem(f"task.rewards[{i}]", f"unknown reward {name!r}; registered: {known}")
            )
    if not t.rewards:
        out.append(Problem("task.rewards", "at least one reward is needed"))
    out += check_template(t.prompt_template)
    if t.kind in ("jsonl", "parquet", "hf") and t.url:
        from rpeg.runtime.datasets.files import RowKeys

        out += check_examples(t.url, t.kind, keys=RowKeys.from_task(t))
    return out


# ------------------------------------------------------------------------------ places
def check_places(config: RunConfig, local: bool | None = None) -> list[Problem]:
    from rpeg.runtime.actors.checkpoint import check_resumable, check_writable

    rt = config.runtime
    out = _check_dir_writable(rt.output_dir, "runtime.output_dir")
    if rt.checkpoint_url:
        try:
            check_writable(rt.checkpoint_url)
        except ProblemsError as exc:
            out += list(exc.problems)
    from rpeg.runtime.actors.checkpoint_identity import run_identity

    ident = run_identity(config)  # staleness and layout: once the plan is compiled
    if not local:
        ident.pop("layout")
        ident.pop("staleness")
    out += check_resumable(rt, config.model, local, ident)
    return out


def check_resumed_layout(config: RunConfig, compiled: Any) -> list[Problem]:
    """With ``--resume``: the compiled step's staleness bound and trainable layout against
    the checkpoint's (``--allow-change layout`` reshards data-parallel replicas)."""
    from rpeg.runtime.actors.checkpoint import check_resumable
    from rpeg.runtime.actors.checkpoint_identity import layout_of

    ident = {
        "staleness": int(compiled.max_staleness),
        "layout": layout_of(compiled.actor_groups),
    }
    return check_resumable(config.runtime, None, None, ident)


def check_file_writable(path: str, where: str) -> list[Problem]:
    """Can the file ``path`` be written (its folder created if missing)?"""
    if os.path.isdir(path):
        return [Problem(where, f"{path!r} is a folder; name a file")]
    return _check_dir_writable(os.path.dirname(os.path.abspath(path)), where)


def _check_dir_writable(path: str, where: str) -> list[Problem]:
    """Can ``path`` be created (if missing) and written? Creates nothing that stays,
    except the folders that the run would create anyway."""
    p = os.path.abspath(path)
    probe_dir = p
    while not os.path.exists(probe_dir):
        parent = os.path.dirname(probe_dir)
        if parent == probe_dir:
            break
        probe_dir = parent
    if os.path.exists(p) and not os.path.isdir(p):
        return [Problem(where, f"{path!r} exists and is not a folder")]
    if not os.path.isdir(probe_dir):
        return [Problem(where, f"{path!r} cannot be created: {probe_dir!r} is not a folder")]
    probe = os.path.join(probe_dir, f".rpeg-write-probe-{uuid.uuid4().hex}")
    try:
        with open(probe, "wb") as fh:
            fh.write(b"ok")
        os.remove(probe)
    except OSError as exc:
        return [Problem(where, f"{path!r} is not writable: {exc.strerror or exc}")]
    return []


# ------------------------------------------------------------------------------ machine
#: seconds the preflight waits for an existing scheduler's port to accept a connection
SCHEDULER_PROBE_S = 5.0


def check_scheduler_reachable(address: str | None) -> list[Problem]:
    """A ``tcp://`` or ``tls://`` scheduler address whose port accepts no connection (nothing
    listening, an unknown host, no route within :data:`SCHEDULER_PROBE_S`) is a problem now,
    not a 60 s connect timeout after the flow started. Only the TCP port is probed: the
    Dask handshake (and TLS) happen when the run connects."""
    import socket
    from urllib.parse import urlsplit

    if not address or not re.match(r"^(tcp|tls)://", address):
        return []
    try:
        parts = urlsplit(address)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        return [
            Problem("cluster.address", f"{address!r}: expected tcp://host:port or tls://host:port")
        ]
    try:
        socket.create_connection((host, port), timeout=SCHEDULER_PROBE_S).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return [Problem("cluster.address", f"no scheduler answers at {address}: {why}")]
    return []


def check_machine(config: RunConfig, *, cluster_devices: int | None = None) -> list[Problem]:
    cc = config.cluster
    out: list[Problem] = []
    address = cc.address
    if address is None and cluster_devices is None:
        limit = machine_device_limit(cc.device_type)
        what = "CUDA devices" if cc.device_type == "cuda" else "CPUs"
        has = f"{limit} {what}"
        if cc.device_type != "cuda" and machine_cpus() != limit:  # fewer than 4 CPUs
            has = f"{machine_cpus()} CPUs (up to {limit} one-thread CPU workers run here)"
        if cc.device_type == "cuda" and limit == 0:
            out.append(Problem("cluster.device_type", "cuda, but no CUDA device is visible"))
        else:
            if cc.num_devices is not None and cc.num_devices > limit:
                out.append(
                    Problem(
                        "cluster.num_devices",
                        f"{cc.num_devices} local devices, but this machine has {has} "
                        "(one worker process per device); use --cluster for more",
                    )
                )
            if cc.device_type == "cpu" and cc.n_workers > limit:
                out.append(
                    Problem(
                        "cluster.n_workers",
                        f"{cc.n_workers} local workers, but this machine has {has}",
                    )
                )
    if address and address.startswith("tls://"):
        for f in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            v = getattr(cc, f)
            if not v:
                out.append(Problem(f"cluster.{f}", f"needed for the tls:// scheduler {address}"))
            elif not os.path.isfile(v):
                out.append(Problem(f"cluster.{f}", f"{v!r} not found"))
    elif address and not re.match(r"^(tcp|tls|inproc|ucx|ws|wss)://", address):
        out.append(
            Problem("cluster.address", f"{address!r}: expected tcp://host:port or tls://host:port")
        )
    if cc.dashboard_address is not None and not _HOSTPORT.match(cc.dashboard_address):
        out.append(
            Problem(
                "cluster.dashboard_address",
                f"{cc.dashboard_address!r}: expected host:port, e.g. 127.0.0.1:8787",
            )
        )
    if not _SIZE.match(cc.worker_memory):
        out.append(
            Problem(
                "cluster.worker_memory",
                f"{cc.worker_memory!r}: expected auto, 0 (no limit) or a size such as 8GiB",
            )
        )
    return out


# ------------------------------------------------------------------------------ GPUs
def plan_gpus(compiled: Any) -> int:
    """How many GPUs the compiled step uses (the distinct devices of its CUDA groups)."""
    return len({d for g in compiled.actor_groups if g.device_type == "cuda" for d in g.devices})


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def check_plan_devices(
    config: RunConfig, compiled: Any, views: dict[str, Any], *, per_worker: bool = True
) -> list[Problem]:
    """The GPUs the compiled step uses against what the workers see (``views``: worker ->
    :class:`rpeg.infra.devices.DeviceView`; ``per_worker`` False: one view stands for a
    machine whose LocalCluster gets a worker per device): a plan needing more GPUs than the
    workers have (per host: one GPU per worker, at most the host's GPUs), a GPU plan on a
    CPU-only cluster, a torch built for a newer CUDA than the driver supports, workers whose
    torch builds differ. [] for a CPU plan."""
    need = plan_gpus(compiled)
    if not need:
        return []
    out: list[Problem] = []
    hosts: dict[str, list[Any]] = {}
    for v in views.values():
        hosts.setdefault(v.host, []).append(v)
    per_host: dict[str, int] = {}
    for host, vs in hosts.items():
        torch_gpus = max(v.cuda_devices for v in vs)
        smi_gpus = max((v.smi_gpus or 0) for v in vs)
        gpus = max(torch_gpus, smi_gpus) if torch_gpus else 0
        per_host[host] = min(len(vs), gpus) if per_worker else gpus
        out += _cuda_mismatch(host, vs)
    builds = sorted({v.torch_cuda for v in views.values() if v.torch_cuda})
    if len(builds) > 1:
        out.append(
            Problem("cluster.name", f"the workers' torch builds differ: CUDA {', '.join(builds)}")
        )
    have = sum(per_host.values())
    if have == 0:
        out.append(
            Problem(
                "cluster.name",
                f"{config.cluster.name!r} is a GPU cluster: the plan runs on {need} GPU(s), but "
                f"the {len(views)} worker(s) see no CUDA device (a CPU-only cluster: plan for "
                "local-cpu, or start the workers on GPU machines)",
            )
        )
    elif need > have:
        where = ", ".join(f"{h}: {n}" for h, n in per_host.items())
        out.append(
            Problem(
                "cluster.num_devices",
                f"the plan uses {need} GPUs but the workers have {have} ({where}; one GPU per "
                "worker): lower cluster.num_devices or add GPU workers",
            )
        )
    return out


def _cuda_mismatch(host: str, views: list[Any]) -> list[Problem]:
    """A torch whose CUDA is newer than the driver's, or GPUs torch cannot see."""
    for v in views:
        if v.torch_cuda and v.driver_cuda and _version(v.torch_cuda) > _version(v.driver_cuda):
            return [
                Problem(
                    "cluster.name",
                    f"CUDA version mismatch on {host}: torch is built for CUDA {v.torch_cuda} "
                    f"but the driver supports CUDA {v.driver_cuda} (install a torch for the "
                    "driver's CUDA, or update the driver)",
                )
            ]
        if not v.cuda_devices and v.smi_gpus:
            build = f"CUDA {v.torch_cuda}" if v.torch_cuda else "a CPU build"
            return [
                Problem(
                    "cluster.name",
                    f"{host}: nvidia-smi lists {v.smi_gpus} GPU(s) (driver CUDA "
                    f"{v.driver_cuda or '?'}) but torch ({build}) sees none: a CUDA build of "
                    "torch matching the driver is needed",
                )
            ]
    return []
