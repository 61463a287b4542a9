"""What GPUs the run's machines have, asked where the ranks will run (before any actor).

:func:`device_view` runs in a process (a Dask worker through :func:`cluster_device_views`,
or this process for a LocalCluster: its workers see what it sees) and reports torch's
CUDA devices and build, and what ``nvidia-smi`` lists (the GPUs and the CUDA version the
driver supports), so that :func:`rpeg.preflight.check_plan_devices` can refuse a plan
that needs more GPUs than the workers have, a GPU plan on a CPU-only cluster, or a torch
built for a newer CUDA than the driver's, naming the numbers.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceView:
    """One process's view of the GPUs."""

    host: str
    cuda_devices: int  # torch.cuda.device_count() (0: no CUDA torch, no driver, no GPU)
    torch_cuda: str | None  # torch.version.cuda (None: a CPU build)
    smi_gpus: int | None  # GPUs nvidia-smi lists (None: no nvidia-smi here)
    driver_cuda: str | None  # the CUDA version the driver supports (nvidia-smi's header)
    visible: str | None  # CUDA_VISIBLE_DEVICES


def _nvidia_smi(timeout_s: float = 10.0) -> tuple[int | None, str | None]:
    """(GPUs listed, driver CUDA version) from ``nvidia-smi`` (None, None without it)."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        header = subprocess.run(
            ["nvidia-smi"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    gpus = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", header.stdout)
    return gpus, (m.group(1) if m else None)


def device_view() -> DeviceView:
    """This process's view (module doc)."""
    count, build = 0, None
    try:
        import torch

        build = torch.version.cuda
        count = int(torch.cuda.device_count()) if build else 0
    except Exception:  # noqa: BLE001 - no torch or a broken driver: torch sees no GPU
        count = 0
    smi, driver = _nvidia_smi()
    return DeviceView(
        host=socket.gethostname(),
        cuda_devices=count,
        torch_cuda=build,
        smi_gpus=smi,
        driver_cuda=driver,
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def cluster_device_views(client: Any) -> dict[str, DeviceView]:
    """Every worker's view (worker address -> :class:`DeviceView`)."""
    return dict(client.run(device_view))
