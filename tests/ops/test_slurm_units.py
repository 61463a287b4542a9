"""``cluster.kind: slurm`` without Slurm: the config's checks, the job a SLURMCluster would
submit, the worker names of a job's tasks, and the placement order of workers."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError


def _slurm(**over):
    cluster = {"kind": "slurm", "interface": "ib0", **over.pop("cluster", {})}
    cluster["slurm"] = {**cluster.get("slurm", {}), **over}
    return RunConfig.from_dict({"cluster": cluster}).cluster


@pytest.mark.parametrize(
    "cluster,field,words",
    [
        ({"kind": "slurm"}, "cluster", "needs interface"),
        ({"kind": "slurm", "interface": "lo", "address": "tcp://h:8786"}, "cluster", "allowed"),
        ({"kind": "pbs"}, "cluster.kind", "'local' or 'slurm'"),
        ({"kind": "slurm", "interface": "eth 0"}, "cluster.interface", "interface name"),
        (
            {"kind": "slurm", "interface": "lo", "slurm": {"time": "1h"}},
            "cluster.slurm.time",
            "01:00:00",
        ),
        (
            {
                "kind": "slurm",
                "interface": "lo",
                "slurm": {"gpus_per_node": 4, "workers_per_node": 2},
            },
            "cluster.slurm",
            "one worker per GPU",
        ),
        (
            {"kind": "slurm", "interface": "lo", "slurm": {"extra_directives": ["exclusive"]}},
            "cluster.slurm.extra_directives",
            "sbatch options",
        ),
        (
            {"kind": "slurm", "interface": "lo", "worker_env": {"A-B": "1"}},
            "cluster.worker_env",
            "names",
        ),
        ({"kind": "slurm", "interface": "lo", "device_type": "cuda"}, "cluster", "gpus_per_node"),
    ],
)
def test_bad_slurm_settings_name_the_field(cluster, field, words):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"cluster": cluster})
    [p] = e.value.problems
    assert p.where == field and words in p.what, (p.where, p.what)


def test_job_has_one_srun_task_per_gpu_with_its_cpus_and_non_daemonic_workers():
    from rpeg.infra.slurm_cluster import job_kwargs, workers_and_nodes

    cc = _slurm(
        gpus_per_node=4,
        cpus_per_worker=72,
        partition="normal",
        account="a01",
        cluster={"nccl_net": "AWS Libfabric", "worker_env": {"FI_CXI_DISABLE_HOST_REGISTER": "1"}},
    )
    assert workers_and_nodes(cc, 10) == (4, 3)  # 10 ranks: 3 nodes of 4 GPUs
    kw = job_kwargs(cc, 10, torch_threads=2, python="/env/bin/python")
    assert kw["processes"] == 4 and kw["cores"] == 4  # one thread (the actor's) per worker
    assert kw["queue"] == "normal" and kw["account"] == "a01"
    srun = kw["python"].split()
    assert srun[0] == "srun" and srun[-1] == "/env/bin/python"
    assert {"--ntasks-per-node=4", "--cpus-per-task=72", "--gpus-per-task=1"} <= set(srun)
    assert {"--nodes=1", "--ntasks-per-node=4", "--cpus-per-task=72", "--gpus-per-node=4"} <= set(
        kw["job_extra_directives"]
    )
    assert "-n 1" in kw["job_directives_skip"] and "--cpus-per-task" in kw["job_directives_skip"]
    assert kw["worker_command"] == "rpeg.infra.slurm_worker"
    args = kw["worker_extra_args"]
    assert args[args.index("--resources") + 1] == "device=1"
    pro = kw["job_script_prologue"]
    assert "export DASK_DISTRIBUTED__WORKER__DAEMON=False" in pro
    assert "export NCCL_SOCKET_IFNAME=ib0" in pro and "export GLOO_SOCKET_IFNAME=ib0" in pro
    assert "export NCCL_NET='AWS Libfabric'" in pro
    assert "export FI_CXI_DISABLE_HOST_REGISTER=1" in pro
    assert "export OMP_NUM_THREADS=2" in pro
    assert kw["interface"] == "ib0" and kw["scheduler_options"]["interface"] == "ib0"
    assert kw["scheduler_options"]["dashboard_address"].startswith("127.0.0.1:")
    assert "security" not in kw
    from rpeg.infra.cluster import PRELOAD

    assert args[args.index("--preload") + 1] == PRELOAD


def test_the_submitted_script_of_a_real_slurm_cluster(tmp_path):
    """dask-jobqueue's own script from these settings (no job submitted): the header has no
    '-n 1' and one --cpus-per-task, srun carries the CPUs, the workers the daemon setting."""
    pytest.importorskip("dask_jobqueue")
    from dask_jobqueue import SLURMCluster
    from rpeg.infra.slurm_cluster import job_kwargs

    cc = _slurm(gpus_per_node=2, cpus_per_worker=8, cluster={"interface": "lo"})
    cl = SLURMCluster(**job_kwargs(cc, 4))
    try:
        script = cl.job_script()
    finally:
        cl.close()
    header = [x for x in script.splitlines() if x.startswith("#SBATCH")]
    assert "#SBATCH -n 1" not in header and not any("--mem" in x for x in header)
    assert [x for x in header if "cpus-per-task" in x] == ["#SBATCH --cpus-per-task=8"]
    [cmd] = [x for x in script.splitlines() if x.startswith("srun ")]
    assert "--cpus-per-task=8" in cmd and "-m rpeg.infra.slurm_worker" in cmd
    assert "--interface lo" in cmd and "--resources device=1" in cmd
    assert script.index("DASK_DISTRIBUTED__WORKER__DAEMON=False") < script.index("srun ")


def test_tls_files_make_every_dask_role_use_tls(tmp_path):
    from rpeg.infra.slurm_cluster import job_kwargs, security

    files = {k: str(tmp_path / k) for k in ("ca.pem", "cert.pem", "key.pem")}
    for f in files.values():
        open(f, "w").close()
    cc = _slurm(
        cluster={
            "tls_ca_file": files["ca.pem"],
            "tls_cert_file": files["cert.pem"],
            "tls_key_file": files["key.pem"],
        }
    )
    sec = security(cc)
    assert sec.require_encryption and sec.tls_worker_cert == files["cert.pem"]
    assert sec.tls_scheduler_key == files["key.pem"] and sec.tls_client_cert == files["cert.pem"]
    kw = job_kwargs(cc, 2, sec=sec)
    assert kw["protocol"] == "tls://" and kw["security"] is sec
    with pytest.raises(ConfigError, match="tls_key_file"):
        security(_slurm(cluster={"tls_ca_file": files["ca.pem"], "tls_cert_file": "c"}))


def test_a_task_names_its_worker_after_its_local_id():
    from rpeg.infra.slurm_worker import worker_name

    argv = ["tcp://h:1", "--name", "SLURMCluster-3", "--nthreads", "1"]
    env = {"RPEG_SLURM_WORKERS_PER_NODE": "4", "SLURM_LOCALID": "2"}
    assert worker_name(argv, env)[2] == "SLURMCluster-3-2"
    assert worker_name(argv, {"SLURM_LOCALID": "0"})[2] == "SLURMCluster-3"  # one per job


def _info(names_hosts, resources=None):
    return {
        f"tcp://{host}:{4000 + i}": {
            "name": name,
            "host": host,
            "resources": {"device": 1} if resources is None else resources,
        }
        for i, (name, host) in enumerate(names_hosts)
    }


def test_placement_orders_numbers_as_numbers_and_keeps_a_node_together():
    from rpeg.infra.cluster import placement_order

    # 12 rank-N workers on 3 hosts of 4 (srun's block distribution): text order would put
    # rank-10 and rank-11 (host 2) between rank-1 and rank-2 (host 0)
    info = _info([(f"rank-{i}", f"10.0.0.{i // 4}") for i in range(12)])
    names = [info[a]["name"] for a in placement_order(info)]
    assert names == [f"rank-{i}" for i in range(12)]
    # jobqueue names: <cluster>-<job>-<local>; job 10 after job 2, local 10 after local 2
    info = _info([(f"SLURMCluster-{j}-{g}", "127.0.0.1") for j in (10, 2) for g in (10, 2, 0)])
    names = [info[a]["name"] for a in placement_order(info)]
    assert names == [f"SLURMCluster-{j}-{g}" for j in (2, 10) for g in (0, 2, 10)]
    # a tp=4 group on devices 0-3 and another on 4-7: each inside one host (node)
    info = _info([(f"w{i}", f"10.0.0.{i % 2}") for i in range(8)])  # names cycle over hosts
    hosts = [info[a]["host"] for a in placement_order(info)]
    assert len(set(hosts[:4])) == 1 and len(set(hosts[4:])) == 1


def test_placement_uses_only_workers_that_declare_a_device():
    from rpeg.infra.cluster import placement_order

    info = _info([("0", "h"), ("1", "h")])
    info["tcp://h:9"] = {"name": "helper", "host": "h", "resources": {}}
    assert "tcp://h:9" not in placement_order(info)
    plain = _info([("b", "h"), ("a", "h")], resources={})
    assert [plain[a]["name"] for a in placement_order(plain)] == ["a", "b"]


def test_collective_env_comes_from_the_cluster_config_of_any_kind():
    from rpeg.infra.network import collective_env

    cc = RunConfig.from_dict(
        {"cluster": {"interface": "ib0", "nccl_net": "IB", "worker_env": {"NCCL_DEBUG": "WARN"}}}
    ).cluster
    assert collective_env(cc) == {
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_NET": "IB",
        "NCCL_DEBUG": "WARN",
    }
    assert collective_env(RunConfig().cluster) == {}  # nothing named: NCCL's own choice


def test_a_task_with_one_gpu_names_it_by_uuid(tmp_path, monkeypatch):
    """Slurm's device cgroup shows every task its GPU as index 0: the same list on every
    worker of a node, which placement would read as shared GPUs. The UUID tells them apart."""
    from rpeg.infra.slurm_worker import own_gpu_uuid

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho GPU-1234abcd-0000-0000-0000-000000000001\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    assert own_gpu_uuid({"CUDA_VISIBLE_DEVICES": "0"}) == "GPU-1234abcd-0000-0000-0000-000000000001"
    assert own_gpu_uuid({"CUDA_VISIBLE_DEVICES": "0,1"}) is None  # several: left as they are
    assert own_gpu_uuid({}) is None  # no GPU
    assert own_gpu_uuid({"CUDA_VISIBLE_DEVICES": "GPU-9"}) is None  # already a UUID
