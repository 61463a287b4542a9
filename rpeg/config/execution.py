"""Where and how a run executes: the cluster, the runtime (steps, staleness bound,
checkpoints, faults, outputs, engine) and the plan search. Each default written once, here."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rpeg import defaults
from rpeg.config.section import Section

#: the most devices a run or a plan may name: 131,072 (beyond the largest GPU clusters built;
#: ``rpeg plan`` searched 16k devices in ~30 s and 131k in ~150 s on a 2-core CPU)
MAX_DEVICES = 1 << 17


#: a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch --time)
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")
#: a network interface name as Linux allows it (no blanks, no slash, at most 15 characters)
_IFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


class SlurmConfig(Section):
    """``cluster.kind: slurm``: the Dask workers are Slurm jobs (dask-jobqueue's SLURMCluster,
    one job per node; inside it one ``srun`` task per worker, docs/operating.md "Slurm")."""

    partition: str | None = Field(None, description="sbatch --partition; None = the default")
    account: str | None = Field(None, description="sbatch --account; None = none")
    nodes: int | None = Field(
        None, ge=1, description="nodes (one job each); None = as many as the plan's ranks need"
    )
    gpus_per_node: int = Field(
        0, ge=0, le=64, description="GPUs of a node (--gpus-per-node); one worker per GPU"
    )
    workers_per_node: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="workers of a node; None = gpus_per_node (1 without GPUs). With GPUs it "
        "must equal gpus_per_node: one worker per GPU",
    )
    cpus_per_worker: int = Field(1, ge=1, le=1024, description="srun --cpus-per-task of a worker")
    memory_per_worker: str | None = Field(
        None,
        description="memory of a worker, e.g. 64GiB (--mem of the job, Dask's limit); "
        "None = no --mem, no limit",
    )
    time: str = Field("01:00:00", description="sbatch --time (HH:MM:SS or D-HH:MM:SS)")
    job_name: str = Field(
        "rpeg-worker", min_length=1, max_length=64, description="sbatch --job-name of the jobs"
    )
    python: str | None = Field(
        None,
        description="the Python of the compute nodes (with rpeg installed); None = the "
        "driver's interpreter (a shared file system)",
    )
    prologue: list[str] = Field(
        default_factory=list,
        description="shell lines run before the workers (module load, source a venv)",
    )
    extra_directives: list[str] = Field(
        default_factory=list, description="more sbatch options, e.g. --exclusive"
    )
    log_directory: str | None = Field(None, description="the jobs' stdout/stderr; None = none")
    start_timeout_s: float = Field(
        600.0, gt=0, description="how long to wait for every worker to join (queued jobs)"
    )

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        if not _SLURM_TIME.match(v):
            raise ValueError(f"got {v!r}; allowed: a Slurm time such as 30, 01:00:00 or 1-12:00:00")
        return v

    @field_validator("extra_directives")
    @classmethod
    def _directives(cls, v: list[str]) -> list[str]:
        bad = [d for d in v if not d.startswith("-") or "\n" in d]
        if bad:
            raise ValueError(f"got {bad}; allowed: sbatch options such as --exclusive")
        return v

    @model_validator(mode="after")
    def _one_worker_per_gpu(self) -> SlurmConfig:
        if self.gpus_per_node and self.workers_per_node not in (None, self.gpus_per_node):
            raise ValueError(
                f"workers_per_node {self.workers_per_node} with gpus_per_node "
                f"{self.gpus_per_node}: allowed: {self.gpus_per_node} or None (one worker per GPU)"
            )
        return self

    @property
    def per_node(self) -> int:
        """Workers of one node."""
        return self.workers_per_node or self.gpus_per_node or 1


class ClusterConfig(Section):
    """Hardware the run plans for and runs on."""

    name: str = Field("local-cpu", description="catalog cluster name (rpeg/specs clusters)")
    num_devices: int | None = Field(
        None,
        ge=1,
        le=MAX_DEVICES,
        description="devices to use; None = all of the cluster (at most MAX_DEVICES)",
    )
    address: str | None = Field(
        None, description="existing Dask scheduler, e.g. tcp://host:8786; None = LocalCluster"
    )
    n_workers: int = Field(defaults.N_WORKERS, ge=1, description="LocalCluster worker processes")
    threads_per_worker: int = Field(defaults.THREADS_PER_WORKER, ge=1)
    device_type: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="LocalCluster kind: cpu = one process per device slot; cuda = dask-cuda "
        "LocalCUDACluster, one worker per visible GPU (gpu extra)",
    )
    worker_memory: str = Field(
        "auto",
        description="memory limit per LocalCluster worker: auto = the machine's memory (or "
        "cgroup limit) split over the workers, a size such as 8GiB, or 0 = no limit",
    )
    dashboard_address: str | None = Field(
        None,
        description="Dask dashboard, e.g. 127.0.0.1:8787; None = no dashboard. Naming a "
        "non-loopback interface exposes it without authentication",
    )
    direct_to_workers: bool = Field(
        True,
        description="the driver calls the ranks' actors on their workers directly (false: "
        "through the scheduler, for workers the driver's machine cannot reach; each call then "
        "takes two more hops)",
    )
    tls_ca_file: str | None = Field(None, description="CA bundle for a tls:// scheduler")
    tls_cert_file: str | None = Field(None, description="client certificate (tls://)")
    tls_key_file: str | None = Field(None, description="client private key (tls://)")
    kind: Literal["local", "slurm"] = Field(
        "local",
        description="local = a LocalCluster (or the scheduler at cluster.address); slurm = "
        "a scheduler here and workers as Slurm jobs (cluster.slurm)",
    )
    interface: str | None = Field(
        None,
        description="network interface of the collectives (NCCL_SOCKET_IFNAME, "
        "GLOO_SOCKET_IFNAME of every worker) and, with kind slurm, of the scheduler and the "
        "workers, e.g. ib0, hsn0; needed with kind slurm",
    )
    nccl_net: str | None = Field(
        None,
        description="NCCL_NET of the workers: the network plugin NCCL must use, e.g. "
        "'AWS Libfabric' (aws-ofi-nccl, Slingshot), IB, Socket; None = NCCL's choice",
    )
    worker_env: dict[str, str] = Field(
        default_factory=dict,
        description="more environment variables of the workers (every kind; a Slurm job "
        "exports them, other workers get them before any process group starts)",
    )
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)

    @field_validator("interface")
    @classmethod
    def _iface(cls, v: str | None) -> str | None:
        if v is not None and not _IFACE.match(v):
            raise ValueError(f"got {v!r}; allowed: a network interface name such as ib0, eth0, lo")
        return v

    @field_validator("worker_env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
        if bad:
            raise ValueError(
                f"names {bad}; allowed: environment variable names ([A-Za-z_][A-Za-z0-9_]*)"
            )
        return v

    @model_validator(mode="after")
    def _slurm_kind(self) -> ClusterConfig:
        if self.kind != "slurm":
            return self
        if self.address:
            raise ValueError(
                f"kind slurm starts its own scheduler but address is {self.address!r}: "
                "allowed: kind local with an address, or kind slurm without one"
            )
        if self.device_type == "cuda" and not self.slurm.gpus_per_node:
            raise ValueError(
                "kind slurm with device_type cuda needs slurm.gpus_per_node >= 1 "
                "(one worker per GPU)"
            )
        if not self.interface:
            raise ValueError(
                "kind slurm needs interface: the network interface the scheduler, the workers "
                "and NCCL/gloo listen on (e.g. ib0, hsn0, eth0; lo for a one-machine Slurm); "
                "nothing listens on every interface"
            )
        return self


#: the largest run seed: numpy's and Python's generators take 32 bits, and per-row sampling
#: seeds add step, row and turn offsets below 2**63 (2**70 failed after start, issue 44)
MAX_SEED = 2**32 - 1


class RuntimeConfig(Section):
    steps: int = Field(60, ge=1, description="RL steps to run")
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="seed of the run's generators (0 .. 2**32-1)"
    )
    max_staleness: int = Field(
        defaults.MAX_STALENESS, ge=0, description="bound k on policy-version lag (0 = on-policy)"
    )
    checkpoint_url: str | None = Field(
        None,
        description="fsspec URL; None = no checkpoints. Each run writes under "
        "<checkpoint_url>/<run_id>/, so runs sharing the URL keep each other's checkpoints",
    )
    run_id: str | None = Field(
        None,
        description="id of this run's checkpoints; None = a new id, or with resume the one "
        "run found at checkpoint_url",
    )
    resume_from: str | None = Field(
        None,
        description="start from this checkpoint (a step folder, a run folder, or a checkpoint "
        "URL holding one run) of any run; later checkpoints go under this run's id",
    )
    checkpoint_every: int = Field(defaults.CHECKPOINT_EVERY, ge=1)
    val_every: int | None = Field(
        defaults.VAL_EVERY,
        ge=0,
        description="validate (greedy, on the held-out or task.val_url prompts) every this "
        "many steps, metrics val/<metric> in the step's line (verl's test_freq); 0 or None = "
        "only after the last step",
    )
    val_before_train: bool = Field(
        defaults.VAL_BEFORE_TRAIN,
        description="validate once before the first step (the 'before RL' accuracy)",
    )
    keep_last: int = Field(defaults.KEEP_LAST, ge=1)
    resume: bool = False
    worker_stall_warn_s: float = Field(
        60.0, gt=0, description="distributed: warn when a worker has not answered a ping this long"
    )
    worker_lost_after_s: float = Field(
        300.0,
        ge=0,
        description="distributed: a worker silent this long (stopped, hung) is killed and "
        "handled as lost (the run recovers from its last checkpoint); 0 = never",
    )
    degenerate_steps_limit: int = Field(
        20,
        ge=0,
        description="stop after this many consecutive steps that cannot move the policy "
        "(non-finite or huge rewards, every update skipped, all advantages 0 at temperature 0; "
        "each is warned about, as are all-0 advantages at a positive temperature, which go "
        "on); 0 = warn only (rpeg.runtime.degenerate)",
    )
    allow_change: list[Literal["algorithm", "staleness", "layout", "model"]] = Field(
        default_factory=list,
        description="with resume: what may differ from the checkpoint's commit marker "
        "(algorithm, staleness, layout -- resharded, data-parallel replicas only -- or model); "
        "anything else that differs is refused before the run starts (docs/runtime.md Faults)",
    )
    output_dir: str = Field(
        "runs/latest",
        description="where run folders go: rpeg train and deployed runs write "
        "<output_dir>/<run_id>/ (config.yaml, metrics, samples, tb, plots) and point "
        "<output_dir>/latest at the newest; a folder named latest puts them beside it",
    )
    log_samples_every: int = Field(
        1,
        ge=0,
        description="write the step's samples (prompt, response, reference answer, rewards, "
        "advantage, length, policy version) to <output_dir>/samples.jsonl every this many "
        "steps and print a few; 0 = never",
    )
    export_hf: bool = Field(
        False,
        description="at every checkpoint also write the policy as a Hugging Face folder "
        "<output_dir>/hf/step-NNNNNNNN (as `rpeg export`); a failed export warns, the run "
        "and its checkpoint go on",
    )
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] | None = Field(
        None,
        description="where per-step metrics go besides metrics.jsonl (both runtimes): "
        "tensorboard (<output_dir>/tb), wandb (offline unless WANDB_MODE/WANDB_API_KEY), "
        "mlflow (MLFLOW_TRACKING_URI or sqlite <output_dir>/mlflow.db); a named one not installed is "
        "refused before start; unset = [tensorboard] when installed",
    )
    torch_threads: int = Field(
        defaults.TORCH_THREADS, ge=1, description="torch intra-op threads per process"
    )
    cpu_binding: Literal["auto", "spread", "none"] = Field(
        "auto",
        description="distributed, CPU ranks: spread = bind each worker process of the run to "
        "its own cores (its slot among the run's workers on that host; rpeg.runtime."
        "cpu_binding); auto = spread only where the run has more workers on a host than the "
        "host has cores; none = leave placement to the OS scheduler",
    )
    engine: Literal["auto", "torch", "vllm"] = Field(
        "auto",
        description="generation engine; auto = vllm where generation runs on CUDA and vllm "
        "is installed, else torch (rpeg.runtime.engines.choice)",
    )
    step_retries: int = Field(
        2, ge=0, description="distributed: recoveries from the last checkpoint after a worker dies"
    )
    collective_timeout_s: float | None = Field(
        None,
        gt=0.0,
        le=7 * 24 * 3600.0,
        description="distributed: seconds a rank waits at a collective before its process group "
        "gives up (NCCL's watchdog then aborts the run); None = the larger of 30 min and 4x "
        "the step the plan predicts (rpeg.runtime.actors.predicted): a dp rank that finished "
        "its rollouts early waits for the slowest one at the next collective",
    )


class SearchConfig(Section):
    """The plan optimizer (``rpeg plan``): budget, determinism, mode."""

    mode: Literal["auto", "exhaustive", "decompose"] = Field(
        "auto",
        description="auto = exhaustive enumeration when the space is small, else decomposed search",
    )
    seed: int = Field(0, description="seed of the annealing refinement (same seed, same plan)")
    max_candidates: int = Field(0, ge=0, description="cap on full-plan evaluations; 0 = no cap")
    time_budget_s: float = Field(
        0.0, ge=0.0, description="stop exploring new cells after this; 0 = no budget"
    )
    top_alternatives: int = Field(5, ge=0, description="alternatives shown in the report")
