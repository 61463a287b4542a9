"""One Slurm task's Dask worker (``python -m rpeg.infra.slurm_worker SCHEDULER --name N ...``).

:mod:`rpeg.infra.slurm_cluster` runs this module under ``srun`` once per worker of a node
(dask-jobqueue's ``worker_command``). dask-jobqueue writes one command per job, ``--name``
being the job's name; a job of W workers expects them as ``<name>-0`` .. ``<name>-<W-1>``
(its ``--nworkers W`` naming). Here each task takes ``<name>-<SLURM_LOCALID>`` (``<name>``
alone when the job has one worker: ``RPEG_SLURM_WORKERS_PER_NODE``), so names order by
(job = node, local GPU), and starts ``dask worker`` with a nanny (it restarts a killed
worker process; rpeg.runtime.step.recovery relies on it).

With ``--gpus-per-task=1`` and Slurm's device cgroup every task sees its GPU as index 0
(``CUDA_VISIBLE_DEVICES=0`` in every task): the same list on every worker of a node, which
rpeg.runtime.actors.rendezvous.gpu_slots reads as "shared GPUs" (worker i takes index i).
The GPU's UUID names it instead (``nvidia-smi``), so the lists differ and each worker uses its
own. Nothing else is read from the environment or the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys


def worker_name(argv: list[str], env: dict[str, str]) -> list[str]:
    """``argv`` with its ``--name N`` made ``N-<SLURM_LOCALID>`` when the job has several
    workers (pure; ``env``: this task's environment)."""
    per = int(env.get("RPEG_SLURM_WORKERS_PER_NODE", "1") or 1)
    out = list(argv)
    if per > 1 and "--name" in out:
        i = out.index("--name") + 1
        out[i] = f"{out[i]}-{int(env.get('SLURM_LOCALID', '0'))}"
    return out


def own_gpu_uuid(env: dict[str, str]) -> str | None:
    """The UUID of this task's one visible GPU (None: not exactly one, or no nvidia-smi)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible or "," in visible or visible.startswith(("GPU-", "MIG-")):
        return None
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    uuids = [u.strip() for u in r.stdout.splitlines() if u.strip()]
    return uuids[0] if r.returncode == 0 and len(uuids) == 1 else None


def main(argv: list[str] | None = None) -> None:
    args = worker_name(list(sys.argv[1:] if argv is None else argv), dict(os.environ))
    if "--nanny" not in args and "--no-nanny" not in args:
        args.append("--nanny")
    uuid = own_gpu_uuid(dict(os.environ))
    if uuid:
        os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    os.execv(sys.executable, [sys.executable, "-m", "distributed.cli.dask_worker", *args])


if __name__ == "__main__":
    main()
