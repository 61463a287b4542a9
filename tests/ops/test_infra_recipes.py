"""The infra recipes parse and carry what RPEG needs (no dask-jobqueue, kubernetes or
Dask operator needed: the manifests are checked as data)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

INFRA = Path(__file__).resolve().parents[2] / "infra"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _containers(doc: dict) -> list[dict]:
    spec = doc["spec"]
    if doc["kind"] == "DaskCluster":
        return spec["worker"]["spec"]["containers"] + spec["scheduler"]["spec"]["containers"]
    return spec["template"]["spec"]["containers"]


def test_every_k8s_manifest_has_required_keys():
    files = sorted((INFRA / "k8s").glob("*.yaml"))
    assert {f.name for f in files} >= {"dask-cluster.yaml", "prefect-server-postgres.yaml"}
    for f in files:
        for d in _docs(f):
            assert {"apiVersion", "kind", "metadata", "spec"} <= set(d), f
            assert d["metadata"].get("name"), f
            if d["kind"] == "Service":
                assert d["spec"].get("type", "ClusterIP") == "ClusterIP", (
                    f"{f}: services stay in-cluster"
                )
                assert d["spec"]["ports"] and d["spec"]["selector"]
            if d["kind"] in ("Deployment", "StatefulSet"):
                sel = d["spec"]["selector"]["matchLabels"]
                assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items(), f
            if d["kind"] in ("Deployment", "StatefulSet", "DaskCluster"):
                for c in _containers(d):
                    assert c.get("name") and c.get("image"), f
                    assert "hostPort" not in str(c.get("ports", "")), f"{f}: no hostPort"


def test_dask_operator_cluster_one_pod_per_node_one_worker_per_gpu():
    docs = _docs(INFRA / "k8s" / "dask-cluster.yaml")
    [d] = [x for x in docs if x["kind"] == "DaskCluster"]
    assert d["apiVersion"] == "kubernetes.dask.org/v1"
    w = d["spec"]["worker"]
    assert isinstance(w["replicas"], int) and w["replicas"] >= 1
    # a pod holds all of its node's GPUs, and no two pods share a node
    anti = w["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["labelSelector"]["matchLabels"]["dask.org/component"] == "worker"
    (c,) = w["spec"]["containers"]
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus > 1
    # dask-cuda's worker: one process per GPU of the pod, each device=1, one thread
    args = [str(a) for a in c["args"]]
    assert args[:3] == ["dask", "cuda", "worker"]
    assert args[args.index("--resources") + 1] == "device=1"
    assert args[args.index("--nthreads") + 1] == "1"
    assert "--nworkers" not in args  # dask cuda worker: one per visible GPU
    assert "rpeg.runtime.actors.serializers" in args
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DASK_DISTRIBUTED__WORKER__DAEMON"] == "False"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert _unsets_malloc_trim(env["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"])
    svc = d["spec"]["scheduler"]["service"]
    assert svc["type"] == "ClusterIP"
    assert 8786 in [p["port"] for p in svc["ports"]]
    assert svc["selector"]["dask.org/cluster-name"] == d["metadata"]["name"]
    # only the namespace's pods reach the cluster's pods
    [pol] = [x for x in docs if x["kind"] == "NetworkPolicy"]
    assert pol["spec"]["podSelector"]["matchLabels"]["dask.org/cluster-name"] == "rpeg-dask"
    assert pol["spec"]["policyTypes"] == ["Ingress"]


def test_prefect_server_uses_postgres_and_auth_from_secrets():
    docs = {
        (d["kind"], d["metadata"]["name"]): d
        for d in _docs(INFRA / "k8s" / "prefect-server-postgres.yaml")
    }
    server = docs[("Deployment", "prefect-server")]
    (c,) = server["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert (
        env["PREFECT_API_DATABASE_CONNECTION_URL"]["valueFrom"]["secretKeyRef"]["key"]
        == "database-url"
    )
    assert (
        "PREFECT_SERVER_API_AUTH_STRING" in env
        and "valueFrom" in env["PREFECT_SERVER_API_AUTH_STRING"]
    )
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"]["value"] == "false"
    worker = docs[("Deployment", "prefect-worker")]
    (wc,) = worker["spec"]["template"]["spec"]["containers"]
    wenv = {e["name"]: e for e in wc["env"]}
    assert "valueFrom" in wenv["PREFECT_API_AUTH_STRING"]
    assert wc["command"][:3] == ["prefect", "worker", "start"] and "process" in wc["command"]
    assert ("StatefulSet", "prefect-postgres") in docs and ("Service", "prefect-postgres") in docs


def _jobqueue_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("jq", INFRA / "slurm" / "jobqueue_cluster.py")
    jq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jq)  # imports no dask_jobqueue at module level
    return jq


def test_slurm_gh200_recipe_is_a_valid_cluster_section():
    from rpeg.infra.slurm_cluster import job_kwargs

    cc = _jobqueue_script().load_recipe(INFRA / "slurm" / "alps-gh200.yaml")
    assert cc.kind == "slurm" and cc.interface == "hsn0" and cc.nccl_net == "AWS Libfabric"
    assert cc.slurm.gpus_per_node == 4 and cc.slurm.per_node == 4
    kw = job_kwargs(cc, 8)
    assert "--gpus-per-node=4" in kw["job_extra_directives"]
    assert {"--gpus-per-task=1", "--cpus-per-task=72"} <= set(kw["python"].split())
    assert kw["python"].split()[-1] == "$HOME/rpeg-venv/bin/python"  # left to the job's shell
    assert "export DASK_DISTRIBUTED__WORKER__DAEMON=False" in kw["job_script_prologue"]
    assert kw["scheduler_options"]["dashboard_address"].startswith("127.0.0.1:")


def test_slurm_recipe_of_another_kind_is_refused(tmp_path):
    from rpeg.errors import ConfigError

    data = yaml.safe_load((INFRA / "slurm" / "alps-gh200.yaml").read_text())
    data["cluster"]["kind"] = "local"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="cluster.kind"):
        _jobqueue_script().load_recipe(p)
    data["cluster"]["kind"] = "slurm"
    data["cluster"]["slurm"]["cpus_per_worker"] = 0
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="cluster.slurm.cpus_per_worker"):
        _jobqueue_script().load_recipe(p)


def test_sbatch_script_is_valid_bash():
    p = INFRA / "slurm" / "rpeg-dask.sbatch"
    text = p.read_text()
    assert "#SBATCH --gpus-per-node=4" in text and "--resources device=1" in text
    assert "--dashboard-address 127.0.0.1:8787" in text
    subprocess.run(["bash", "-n", str(p)], check=True)


def _unsets_malloc_trim(value: str) -> bool:
    """The env value a `dask worker` reads into distributed.nanny.pre-spawn-environ unsets
    MALLOC_TRIM_THRESHOLD_ (the nanny skips keys whose value is None)."""
    import ast

    d = ast.literal_eval(value)
    return "MALLOC_TRIM_THRESHOLD_" in d and d["MALLOC_TRIM_THRESHOLD_"] is None


def test_slurm_recipes_unset_dask_malloc_trim():
    import re

    sbatch = (INFRA / "slurm" / "rpeg-dask.sbatch").read_text()
    m = re.search(r'DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON="([^"]+)"', sbatch)
    assert m and _unsets_malloc_trim(m.group(1))
    from rpeg.infra.slurm_cluster import worker_env

    cc = _jobqueue_script().load_recipe(INFRA / "slurm" / "alps-gh200.yaml")
    assert _unsets_malloc_trim(worker_env(cc)["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"])


def test_worker_environ_drops_malloc_trim_unless_the_user_sets_it(monkeypatch):
    from rpeg.infra.cluster import worker_environ

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    env = worker_environ(3)
    assert env["MALLOC_TRIM_THRESHOLD_"] is None
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == 3
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert worker_environ(1)["MALLOC_TRIM_THRESHOLD_"] == "131072"


@pytest.mark.slow
def test_sbatch_script_starts_a_scheduler_and_a_worker_that_preloads_rpeg(tmp_path):
    """The script itself, with a stand-in ``srun`` that runs its command on this machine
    (one task): its scheduler and its worker command start, the worker registers with
    ``device=1`` and has imported the preload (issue 28: it named a renamed module,
    rpeg.runtime.dist.serializers, and no worker could start)."""
    import json
    import os
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    sched = tmp_path / "sched.json"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RPEG_DASK_INTERFACE": "lo",
        "RPEG_DASK_SCHEDULER_FILE": str(sched),
        "SLURM_PROCID": "0",
    }
    script = INFRA / "slurm" / "rpeg-dask.sbatch"
    text = script.read_text().replace("127.0.0.1:8787", "127.0.0.1:0")  # a free port
    local = tmp_path / "rpeg-dask.sbatch"
    local.write_text(text)
    proc = subprocess.Popen(
        ["bash", str(local)],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        from distributed import Client

        deadline = time.monotonic() + 240
        while not (sched.exists() and sched.stat().st_size) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        with Client(scheduler_file=str(sched), timeout="60s") as client:
            client.wait_for_workers(1, timeout=max(1.0, deadline - time.monotonic()))
            info = client.scheduler_info()["workers"]
            [w] = info.values()
            assert w["name"] == "rank-0" and w["resources"] == {"device": 1}
            import sys as _sys

            loaded = client.run(lambda: "rpeg.runtime.actors.serializers" in _sys.modules)
            assert list(loaded.values()) == [True]
        assert json.loads(sched.read_text())["address"].startswith("tcp://127.0.0.1:")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
