"""``cluster.kind: slurm`` on a real Slurm: ``scripts/slurm_local.sh`` starts slurmctld and
two slurmd "nodes" on this machine, ``rpeg train`` runs 2 steps with its workers as Slurm
jobs (dask-jobqueue), and the summary names the jobs. Skipped, with the reason, where Slurm
is not installed or this is not root (slurmd starts jobs as their users)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
CONF = "/tmp/rpeg-slurm/slurm.conf"  # the script's default folder


def _why_not() -> str:
    missing = [t for t in ("sbatch", "slurmctld", "slurmd", "munged") if not shutil.which(t)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing: bash {SCRIPT} install)"
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd starts jobs as their users)"
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        return "dask-jobqueue is not installed (pip install -e '.[slurm]')"
    return ""


@pytest.fixture(scope="module")
def slurm():
    why = _why_not()
    if why:
        pytest.skip(why)
    env = {**os.environ, "SLURM_CONF": CONF}
    was_up = (
        subprocess.run(["bash", str(SCRIPT), "status"], env=env, capture_output=True).returncode
        == 0
    )
    r = subprocess.run(
        ["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    yield env
    if not was_up:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


def _jobs_of(env: dict, ids: list[str]) -> dict[str, dict[str, str]]:
    """Slurm's own record of these jobs (scontrol show job): name, node, state."""
    out = {}
    for j in ids:
        r = subprocess.run(
            ["scontrol", "-o", "show", "job", j], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, f"Slurm does not know job {j}: {r.stderr}"
        fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
        out[j] = fields
    return out


def _certs(tmp_path) -> tuple[str, str]:
    """A self-signed certificate (its own CA) and its key (Dask checks the chain only)."""
    cert, key = tmp_path / "rpeg.pem", tmp_path / "rpeg.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=rpeg-test"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.mark.slow
def test_rpeg_train_runs_two_steps_on_slurm_workers(slurm, tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed (the test's TLS certificate)")
    cert, key = _certs(tmp_path)
    cfg = {
        "workload": {
            "num_prompts": 2,
            "samples_per_prompt": 2,
            "max_response_tokens": 6,
            "micro_batch_size": 4,
        },
        "task": {"heldout_size": 2},
        "optim": {"warmup_sft_steps": 0},
        "runtime": {"steps": 2, "output_dir": str(tmp_path / "out"), "val_before_train": False},
        "cluster": {
            "kind": "slurm",
            "interface": "lo",
            "num_devices": 2,
            "n_workers": 4,
            "nccl_net": "Socket",
            "tls_ca_file": cert,
            "tls_cert_file": cert,
            "tls_key_file": key,
            "slurm": {
                "nodes": 2,
                "workers_per_node": 2,
                "time": "00:15:00",
                "start_timeout_s": 180,
                "log_directory": str(tmp_path / "slurm-logs"),
            },
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    summary = tmp_path / "summary.json"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from rpeg.cli import main; sys.exit(main())",
            "train",
            str(path),
            "--summary-json",
            str(summary),
        ],
        cwd=tmp_path,
        env={**slurm, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"},
        capture_output=True,
        text=True,
        timeout=420,
    )
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    s = json.loads(summary.read_text())
    assert s["steps"] == 2
    # the workers were Slurm jobs: two jobs (one per node), named as the config says
    ids = s["slurm_job_ids"]
    assert len(ids) == 2, s.get("workers")
    jobs = _jobs_of(slurm, ids)
    assert {j["JobName"] for j in jobs.values()} == {"rpeg-worker"}
    assert sorted(j["NodeList"] for j in jobs.values()) == ["node1", "node2"]
    workers = s["workers"]  # in placement order
    assert len(workers) == 4
    assert {w["slurm_job_id"] for w in workers} == set(ids)
    # every worker listens on the configured interface, over TLS
    assert all(w["address"].startswith("tls://127.0.0.1:") for w in workers), workers
    # non-daemonic (a vLLM engine can start its engine-core process there)
    assert [w["daemon"] for w in workers] == [False] * 4
    # ranks ordered by (node, local id): one node's workers are consecutive
    # (a job is a node; jobs in the order of jobqueue's worker names, ids in any order)
    jobs_in_order = [w["slurm_job_id"] for w in workers]
    assert jobs_in_order[0] == jobs_in_order[1] != jobs_in_order[2] == jobs_in_order[3]
    assert [w["slurm_localid"] for w in workers] == ["0", "1", "0", "1"]
    assert [w["name"].rsplit("-", 1)[1] for w in workers] == ["0", "1", "0", "1"]
    # the collectives' interface variables from the cluster config, in every worker
    for w in workers:
        assert w["env"]["NCCL_SOCKET_IFNAME"] == "lo" == w["env"]["GLOO_SOCKET_IFNAME"]
        assert w["env"]["NCCL_NET"] == "Socket"
    # the jobs are gone once the run closed its cluster
    q = subprocess.run(
        ["squeue", "-h", "-j", ",".join(ids), "-t", "RUNNING,PENDING"],
        env=slurm,
        capture_output=True,
        text=True,
    )
    assert q.stdout.strip() == "", q.stdout
