"""Several "hosts" on one machine: the Dask scheduler and each worker in its own network
namespace (``ip netns`` + veth pairs on a bridge; root only, skipped with the reason
otherwise). A k=1 run with the generator on one host and a dp=2 trainer group across two
others runs two steps: the trainer's rendezvous (on the worker's own address), its gloo
all-reduce, the batch pull (generator -> trainer actors) and the weight broadcast (trainer ->
generator) all cross the virtual network, not loopback.

Addresses: 10.231.0.0/24, only on the namespaces and the bridge this test creates (and
removes in ``finally``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest

pytestmark = pytest.mark.slow

NET = "10.231.0"
SCHED = f"{NET}.1"


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def _why_not() -> str:
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    if shutil.which("dask") is None:
        return "the dask CLI is not on PATH"
    probe = f"rpeg-probe-{uuid.uuid4().hex[:6]}"
    r = _sh("ip", "netns", "add", probe, check=False)
    if r.returncode:
        return f"ip netns add is not allowed here: {r.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return ""


class Hosts:
    """A bridge in the root namespace and one namespace per host, each with ``eth0``."""

    def __init__(self, n: int):
        tag = uuid.uuid4().hex[:4]
        self.bridge = f"rpbr{tag}"
        self.names = [f"rpeg-{tag}-{i}" for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{NET}.254/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, ns in enumerate(self.names):
            host_end = f"rpv{tag}{i}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", host_end, "master", self.bridge)
            _sh("ip", "link", "set", host_end, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def addr(self, i: int) -> str:
        return f"{NET}.{i + 1}"

    def spawn(self, i: int, *cmd: str, log) -> subprocess.Popen:
        env = {
            **os.environ,
            "GLOO_SOCKET_IFNAME": "eth0",
            "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
            "OMP_NUM_THREADS": "1",
            "DO_NOT_TRACK": "1",
        }
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.names[i], *cmd], env=env, stdout=log, stderr=log
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in self.names:
            _sh("ip", "netns", "del", ns, check=False)
        _sh("ip", "link", "del", self.bridge, check=False)


def test_async_run_across_network_namespaces(tmp_path):
    why = _why_not()
    if why:
        pytest.skip(why)
    from rpeg.infra import start_cluster

    from rpeg.compile import compile_plan
    from rpeg.ir import bound_async, build
    from rpeg.plan import disaggregated_plan
    from rpeg.runtime.actors.driver import DistributedRun
    from tests.runtime.actors.conftest import tiny_config

    dask = shutil.which("dask")
    hosts = Hosts(4)  # 0: scheduler, 1: generator, 2-3: the dp=2 trainer
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 -- closed in finally, shared by 4 processes
    cl = run = None
    try:
        hosts.spawn(
            0, dask, "scheduler", "--host", SCHED, "--port", "8786", "--no-dashboard", log=log
        )
        time.sleep(3)
        for i in (1, 2, 3):
            hosts.spawn(
                i,
                dask,
                "worker",
                f"tcp://{SCHED}:8786",
                "--host",
                hosts.addr(i),
                "--name",
                f"w{i}",
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                "--preload",
                "rpeg.runtime.actors.serializers",
                log=log,
            )
        cl = start_cluster(f"tcp://{SCHED}:8786", torch_threads=1)
        deadline = time.monotonic() + 120
        while len(cl.workers) < 3 and time.monotonic() < deadline:
            time.sleep(1)
        workers = cl.workers
        assert len(workers) == 3, (workers, (tmp_path / "dask.log").read_text()[-2000:])
        assert all(w.startswith(f"tcp://{NET}.") for w in workers)
        cfg = tiny_config(
            tmp_path,
            **{"runtime.max_staleness": 1, "cluster.num_devices": 3, "optim.warmup_sft_steps": 0},
        )
        plan = disaggregated_plan(
            bound_async(build("grpo"), 1),
            gen_devices=1,
            train_devices=2,
            builder=None,
            micro_batch_size=4,
        )
        compiled = compile_plan(plan, cfg, cluster_devices=3)
        trainer = compiled.group(compiled.trainer_group)
        assert trainer.dp == 2 and trainer.world_size == 2
        run = DistributedRun(cfg, compiled, cl)
        run.start_actors(workers)
        with run.client.as_current():
            pids = {a.ping().result()["pid"] for a in run.groups[trainer.name]}
            assert len(pids) == 2
            rdv = run.groups[trainer.name][0].rendezvous().result()
        assert rdv.startswith(f"{NET}."), rdv  # the worker's own address, not 127.x
        run.sync_weights(-1)
        for step in range(2):
            m = dict(run.rollout(step))
            run.driver_bytes.clear()
            m.update(run.take(step))
            for t in compiled.tasks_in("train"):
                if "sync_weights" not in t.kinds:
                    m.update(run.run_unit(step, t.name))
            m.update(run.sync_weights(step))
            m.update(run.data_plane_metrics(step))
            assert m["driver_bytes"] == 0.0 and m["actor_to_actor_bytes"] > 0
            assert m["weight_sync_bytes"] > 0
        sums = run.group(trainer.name).param_checksums()
        assert sums[0] == pytest.approx(sums[1], rel=1e-6)  # dp ranks agree after gloo
        with run.client.as_current():
            gen = run.groups[compiled.rollout_group][0]
            assert gen.weights_checksum().result() == (
                run.groups[trainer.name][0].weights_checksum().result()
            )
    finally:
        if run is not None:
            run.close()
        if cl is not None:
            cl.close()
        hosts.close()
        log.close()
