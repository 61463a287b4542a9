"""A GPU plan against the GPUs the workers see (:func:`check_plan_devices`: counts, the CUDA
driver and runtime versions, per host), before any actor starts."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rpeg.config import RunConfig
from rpeg.errors import Problem

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep


# ------------------------------------------------------------------------------ GPUs
def plan_gpus(compiled: CompiledStep) -> int:
    """How many GPUs the compiled step uses (the distinct devices of its CUDA groups)."""
    return len({d for g in compiled.actor_groups if g.device_type == "cuda" for d in g.devices})


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def check_plan_devices(
    config: RunConfig, compiled: CompiledStep, views: dict[str, Any], *, per_worker: bool = True
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
