"""What one rank runs, resolved once by the driver: :class:`RankProgram`.

A rank receives no config text. The driver (``rpeg.runtime.actors.lifecycle.ActorSet``)
resolves, once per run, every decision a rank used to take from the run config -- the
group's generation engine, the collective timeout from the predicted step, the seeds, the
warm-up steps, the TLS files of the rendezvous store -- and hands each rank of a group the
same frozen :class:`RankProgram`: its compiled :class:`~rpeg.compile.step.GroupSpec`, the
staleness bound, and the typed config sections its roles and stages read
(:class:`RoleInputs`). Ranks build their roles from it (``rpeg.runtime.role_builder``) and
decide nothing again.

Pure data (no torch, dask or prefect): pydantic config sections are typed data and travel
as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.compile.step import GroupSpec
from rpeg.config import (
    AlgorithmConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TaskConfig,
    WorkloadConfig,
)

#: the generation engines a group can be resolved to (``auto`` is resolved by the driver)
RESOLVED_ENGINES = ("torch", "vllm")


@dataclass(frozen=True)
class RankRuntime:
    """The runtime knobs a rank reads (``runtime.*`` of the run config): the run's seed,
    torch's intra-op threads, the CPU core binding and how often samples are logged."""

    seed: int
    torch_threads: int
    cpu_binding: str
    log_samples_every: int


@dataclass(frozen=True)
class RoleInputs:
    """The typed config sections a rank's roles and stages read. Its attribute paths are
    those of :class:`~rpeg.config.RunConfig` for what they read (``model``, ``task``,
    ``algorithm``, ``optim``, ``workload``, ``runtime.seed``, ``runtime.torch_threads``,
    ``warmup_sft_steps``), so the functions the single-process trainer calls with its
    ``RunConfig`` take these as they are."""

    model: ModelConfig
    task: TaskConfig
    algorithm: AlgorithmConfig
    optim: OptimConfig
    workload: WorkloadConfig
    runtime: RankRuntime
    #: the supervised warm-up steps actually run (``RunConfig.warmup_sft_steps`` resolved)
    warmup_sft_steps: int

    @classmethod
    def of(cls, config: RunConfig) -> RoleInputs:
        rt = config.runtime
        return cls(
            model=config.model,
            task=config.task,
            algorithm=config.algorithm,
            optim=config.optim,
            workload=config.workload,
            runtime=RankRuntime(
                seed=int(rt.seed),
                torch_threads=int(rt.torch_threads),
                cpu_binding=str(rt.cpu_binding),
                log_samples_every=int(rt.log_samples_every),
            ),
            warmup_sft_steps=int(config.warmup_sft_steps),
        )


@dataclass(frozen=True)
class RankProgram:
    """Everything a rank of one actor group is started with, but its rank index and its
    machine's slots (the same object for every rank of the group)."""

    #: the compiled group the rank belongs to
    group: GroupSpec
    #: the compiled step's staleness bound k
    staleness: int
    #: the generator group runs ahead of its trainer (the compiled step's ``async_rollout``)
    async_rollout: bool
    #: the group's generation engine, resolved once by the driver (``torch`` or ``vllm``)
    engine: str
    #: how long a rank waits at a collective (process groups, the weight-sync group), s
    collective_timeout_s: float
    #: the step the performance model predicts for the run's plan (None: no prediction)
    predicted_step_s: float | None
    #: the config sections the rank's roles and stages read
    inputs: RoleInputs
    #: ``(ca, cert, key)`` files of the rendezvous store's mutual TLS (None: no TLS)
    tls_files: tuple[str, str, str] | None = None

    def __post_init__(self) -> None:
        if self.engine not in RESOLVED_ENGINES:
            raise ValueError(
                f"RankProgram.engine: {self.engine!r}; a resolved engine is one of "
                f"{', '.join(RESOLVED_ENGINES)}"
            )
        if self.collective_timeout_s <= 0:
            raise ValueError("RankProgram.collective_timeout_s must be > 0")


def rank_program(
    config: RunConfig,
    group: GroupSpec,
    *,
    staleness: int,
    async_rollout: bool,
    engine: str,
    collective_timeout_s: float,
    predicted_step_s: float | None = None,
    tls_files: tuple[str, str, str] | None = None,
) -> RankProgram:
    """The program of ``group``'s ranks: the decisions the driver resolved (``engine``,
    ``collective_timeout_s``, ``tls_files``) and the sections the ranks read from
    ``config``."""
    return RankProgram(
        group=group,
        staleness=int(staleness),
        async_rollout=bool(async_rollout),
        engine=engine,
        collective_timeout_s=float(collective_timeout_s),
        predicted_step_s=predicted_step_s,
        inputs=RoleInputs.of(config),
        tls_files=tls_files,
    )
