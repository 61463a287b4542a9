"""Two "nodes" of two workers each on one machine (network namespaces, veth pairs on a
bridge: tests/runtime/actors/test_multihost.py's ``Hosts``; root only, skipped with the reason
otherwise), every Dask connection TLS: a dp=2 x tp=2 run trains 2 steps with each
tensor-parallel group inside one node although the workers' names alternate between the nodes
(srun's cyclic distribution), and the NCCL/gloo interface variables of the cluster config are
in every worker's environment."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow


def _certs(tmp_path) -> tuple[str, str]:
    """A self-signed certificate (its own CA) and its key: Dask checks the chain, not names."""
    cert, key = tmp_path / "rpeg.pem", tmp_path / "rpeg.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=rpeg-test"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


def test_two_nodes_tp_groups_stay_inside_a_node_over_tls(tmp_path):
    from tests.runtime.actors.test_multihost import SCHED, Hosts, _why_not

    why = _why_not() or ("" if shutil.which("openssl") else "openssl is not installed")
    if why:
        pytest.skip(why)
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster

    from rpeg.config import RunConfig

    cert, key = _certs(tmp_path)
    tls = ["--tls-ca-file", cert, "--tls-cert", cert, "--tls-key", key]
    dask = shutil.which("dask")
    hosts = Hosts(3)  # 0: the scheduler; 1 and 2: the nodes
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 -- closed in finally
    cl = None
    try:
        hosts.spawn(0, dask, "scheduler", "--host", SCHED, "--port", "8786", "--protocol",
                    "tls", *tls, "--no-dashboard", log=log)  # fmt: skip
        time.sleep(3)
        for rank in range(4):  # cyclic: rank-0, rank-2 on node 1; rank-1, rank-3 on node 2
            node = 1 + rank % 2
            hosts.spawn(node, dask, "worker", f"tls://{SCHED}:8786", "--host", hosts.addr(node),
                        "--name", f"rank-{rank}", "--nthreads", "1", "--no-nanny",
                        "--no-dashboard", "--resources", "device=1", "--preload",
                        "rpeg.runtime.actors.serializers", *tls, log=log)  # fmt: skip
        cfg = RunConfig.from_dict(
            {
                "workload": {"num_prompts": 2, "samples_per_prompt": 2,
                             "max_response_tokens": 6, "micro_batch_size": 4},
                "task": {"heldout_size": 2},
                "optim": {"warmup_sft_steps": 0},
                "runtime": {"steps": 2, "output_dir": str(tmp_path / "out"),
                            "val_before_train": False},
                "cluster": {"num_devices": 4, "n_workers": 4, "interface": "eth0",
                            "nccl_net": "Socket", "tls_ca_file": cert, "tls_cert_file": cert,
                            "tls_key_file": key},
                "plan": {"cluster": "local-cpu", "model": "rpeg-tiny", "graph": {"builder": None},
                         "staleness": 0,
                         "units": {u: {"devices": "0-3", "tp": 2} for u in
                                   ("generate", "ref_logprob", "old_logprob", "advantage",
                                    "train_actor", "sync_weights")} | {"reward": {"devices": "0-3"}}},
            }
        )  # fmt: skip
        cl = start_cluster(f"tls://{SCHED}:8786", torch_threads=1, cluster_config=cfg.cluster)
        deadline = time.monotonic() + 150
        while len(cl.workers) < 4 and time.monotonic() < deadline:
            time.sleep(1)
        workers = cl.workers
        assert len(workers) == 4, (workers, (tmp_path / "dask.log").read_text()[-3000:])
        # every Dask listener is TLS (the scheduler, each worker)
        assert cl.address.startswith("tls://") and all(w.startswith("tls://") for w in workers)
        info = cl.client.scheduler_info(n_workers=-1)["workers"]
        # placement order: one node's workers consecutive (device i -> workers[i]), so the tp
        # groups (ranks 0-1 and 2-3: rank // tp) stay inside a node; by name alone they
        # would alternate (rank-0 node 1, rank-1 node 2, ...)
        hosts_in_order = [info[w]["host"] for w in workers]
        assert hosts_in_order[0] == hosts_in_order[1] != hosts_in_order[2] == hosts_in_order[3]
        assert {info[w]["host"] for w in workers} == {hosts.addr(1), hosts.addr(2)}

        def _env():
            import os

            return {
                k: os.environ.get(k)
                for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_NET")
            }

        envs = cl.client.run(_env)
        assert (
            list(envs.values())
            == [{"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_NET": "Socket"}]
            * 4
        )
        s = train_on(cl, cfg, progress=False)
        assert s["steps"] == 2, s
        # the dp replicas (one per node) agree after gloo's all-reduce across the nodes
        sums = s["_extra"]["param_checksums"]
        assert sums, s.keys()
    finally:
        if cl is not None:
            cl.close()
        hosts.close()
        log.close()
