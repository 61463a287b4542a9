"""The driver's side of :class:`rpeg.compile.rank_program.RankProgram`: every decision a rank
takes from the run, resolved once here and handed to the ranks (they receive no config).

* the generation engine of each group: :func:`rpeg.runtime.engines.choice.rank_engine`, the
  one rule, with vLLM's availability where the group's ranks run (asked of their workers);
* the process groups' timeout: :func:`rpeg.runtime.actors.predicted.collective_timeout_s`
  (``runtime.collective_timeout_s``, else from the performance model's predicted step,
  priced once per run);
* the TLS files of the rendezvous store: :func:`rpeg.runtime.actors.store_tls.tls_files`;
* the sections and seeds the ranks read: :func:`rpeg.compile.rank_program.rank_program`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpeg.compile import CompiledStep, GroupSpec
from rpeg.compile.rank_program import RankProgram, rank_program
from rpeg.config import RunConfig


def run_timeout(config: RunConfig) -> tuple[float, float | None]:
    """``(collective timeout s, predicted step s)`` of the run: the step is priced only when
    ``runtime.collective_timeout_s`` is unset (None then without a prediction)."""
    from rpeg.runtime.actors.predicted import collective_timeout_s, predicted_step_s

    if config.runtime.collective_timeout_s is not None:
        return collective_timeout_s(config), None
    step_s = predicted_step_s(config)
    return collective_timeout_s(config, step_s), step_s


def group_program(
    config: RunConfig,
    group: GroupSpec,
    *,
    staleness: int,
    async_rollout: bool = False,
    vllm_available: bool | None = None,
    timeout: tuple[float, float | None] | None = None,
) -> RankProgram:
    """The program of ``group``'s ranks. ``vllm_available``: whether vLLM imports where the
    ranks run (None: in this process); ``timeout``: :func:`run_timeout`'s answer (None: asked
    now)."""
    from rpeg.runtime.actors.store_tls import tls_files
    from rpeg.runtime.engines.choice import rank_engine

    timeout_s, step_s = run_timeout(config) if timeout is None else timeout
    tls = tls_files(config.cluster)  # the rendezvous store's mutual TLS (None: none)
    return rank_program(
        config,
        group,
        staleness=staleness,
        async_rollout=async_rollout,
        engine=rank_engine(config, group, vllm_available=vllm_available),
        collective_timeout_s=timeout_s,
        predicted_step_s=step_s,
        tls_files=None if tls is None else (tls.ca_file, tls.cert_file, tls.key_file),
    )


def run_programs(
    config: RunConfig,
    compiled: CompiledStep,
    vllm_on: Callable[[GroupSpec], bool | None],
    *,
    async_rollout: bool,
    timeout: tuple[float, float | None] | None = None,
) -> dict[str, RankProgram]:
    """Group name -> the program of its ranks, for every group of ``compiled``.
    ``vllm_on(group)``: whether vLLM imports on the group's workers (None: in this process)."""
    timeout = run_timeout(config) if timeout is None else timeout
    return {
        g.name: group_program(
            config,
            g,
            staleness=compiled.staleness,
            async_rollout=async_rollout,
            vllm_available=vllm_on(g),
            timeout=timeout,
        )
        for g in compiled.actor_groups
    }


def asks_vllm(config: RunConfig, group: GroupSpec) -> bool:
    """Whether the engine rule needs to know if vLLM imports on ``group``'s workers (an
    engine other than ``torch`` declared for it)."""
    declared = {config.runtime.engine, group.gen_engine or "auto"}
    return declared != {"torch"}


def workers_have_vllm(client: Any, workers: list[str]) -> bool:
    """Whether vLLM imports on every one of ``workers`` (asked of them, not of this
    process: the driver may run where vLLM is not installed)."""
    from rpeg.runtime.engines.choice import vllm_importable

    if not workers:
        return False
    answers = client.run(vllm_importable, workers=list(workers))
    return all(bool(answers.get(a)) for a in workers)
