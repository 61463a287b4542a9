"""Services: loopback only, TLS on request, memory from the machine, gone with the command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

psutil = pytest.importorskip("psutil")


def _kill_if_same(procs: dict[int, float]) -> None:
    """Clean up what a test started: only pids whose start time still matches (a reused
    pid belongs to someone else)."""
    for pid, started in procs.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == started:
                p.kill()


def _wait_gone(pid: int, timeout_s: float, started: float | None = None) -> bool:
    """True once ``pid`` is gone (or a zombie, or reused by a process started later)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                return True
            if started is not None and p.create_time() != started:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def test_kill_9_of_the_command_takes_its_services_with_it(tmp_path):
    """Prefect's ephemeral server outlived ``kill -9`` of ``rpeg train``; a detached child
    (its own session, like that server) stands in for it here."""
    script = tmp_path / "cmd.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, time
            from rpeg.infra.lifeline import start_lifeline
            start_lifeline(poll_s=0.2, grace_s=1.0)
            svc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                   start_new_session=True)
            print(svc.pid, flush=True)
            time.sleep(300)
            """
        )
    )
    cmd = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    svc_pid = int(cmd.stdout.readline())
    svc_started = psutil.Process(svc_pid).create_time()
    try:
        time.sleep(2.0)  # several lifeline polls (every 0.2 s) have seen the service
        assert psutil.pid_exists(svc_pid)
        os.kill(cmd.pid, signal.SIGKILL)
        cmd.wait(10)
        assert _wait_gone(svc_pid, 15, svc_started), "the service outlived kill -9 of its command"
    finally:
        cmd.kill()
        _kill_if_same({svc_pid: svc_started})


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    out = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            out.append((c.pid, c.laddr.ip, c.laddr.port))
    return out


def _http_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("dashboard", [False, True])
def test_local_cluster_listens_on_loopback_only(dashboard):
    """The scheduler's HTTP server (dashboard or not) was bound to every interface (``:0``)."""
    from rpeg.infra.cluster import start_cluster

    from rpeg.config import ClusterConfig

    me = psutil.Process()
    # only what this cluster opens: sockets new in this process, and the processes it starts
    # (in a full test run, earlier tests' fixtures leave children of their own)
    before = {(ip, port) for _, ip, port in _listening({me.pid})}
    old_children = {c.pid for c in me.children(recursive=True)}
    with start_cluster(n_workers=1, dashboard=dashboard, cluster_config=ClusterConfig()) as cl:
        new_children = {c.pid for c in me.children(recursive=True)} - old_children
        socks = [s for s in _listening({me.pid}) if (s[1], s[2]) not in before]
        socks += _listening(new_children)
        assert socks, "the cluster listens somewhere"
        exposed = [s for s in socks if s[1] not in ("127.0.0.1", "::1")]
        assert not exposed, exposed
        port = cl.local.scheduler.http_server.port
        if dashboard:
            assert _http_status(f"http://127.0.0.1:{port}/status") == 200


@pytest.mark.parametrize("dashboard", [False, True])
def test_workers_sample_their_stacks_only_for_a_dashboard(dashboard):
    """Dask's worker profiler (a stack walk of every thread each 10 ms, ~6% of a rank's CPU
    here) runs only where its page can be seen."""
    from rpeg.infra.cluster import start_cluster

    from rpeg.config import ClusterConfig

    with start_cluster(n_workers=1, dashboard=dashboard, cluster_config=ClusterConfig()) as cl:
        got = cl.client.run(lambda dask_worker: sorted(dask_worker.periodic_callbacks))
    (callbacks,) = got.values()
    assert "heartbeat" in callbacks
    assert ("profile" in callbacks) is dashboard


@pytest.mark.parametrize("direct", [True, False])
def test_actor_calls_go_to_the_workers_directly_unless_configured_otherwise(direct):
    """Dask's default routes every client -> actor call through the scheduler
    (``distributed.actor.ProxyRPC``: two more hops per unit call); with
    ``cluster.direct_to_workers`` (default True) the client calls the worker."""
    from rpeg.infra.cluster import start_cluster

    from rpeg.config import ClusterConfig

    assert ClusterConfig().direct_to_workers is True
    cfg = ClusterConfig(direct_to_workers=direct)
    with start_cluster(n_workers=1, cluster_config=cfg) as cl:
        assert cl.client.direct_to_workers is direct
        assert cl.client.submit(sum, [1, 2]).result() == 3


@pytest.mark.slow  # > 10 s on 2 cores (docs/architecture.md "Tests")
def test_no_dashboard_unless_asked(tmp_path):
    """In a fresh process: once any dashboard ran in a process, later schedulers there serve
    its pages too (Dask keeps the routes), so this looks at a process of its own."""
    script = tmp_path / "probe.py"
    script.write_text(
        textwrap.dedent(
            """
            import urllib.error, urllib.request
            from rpeg.config import ClusterConfig
            from rpeg.infra.cluster import start_cluster

            if __name__ == "__main__":
                with start_cluster(n_workers=1, cluster_config=ClusterConfig()) as cl:
                    port = cl.local.scheduler.http_server.port
                    try:
                        code = urllib.request.urlopen(
                            f"http://127.0.0.1:{port}/status", timeout=10
                        ).status
                    except urllib.error.HTTPError as e:
                        code = e.code
                    print("STATUS", code, flush=True)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert "STATUS 404" in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.slow  # > 10 s on 2 cores (docs/architecture.md "Tests")
def test_worker_memory_comes_from_the_machine_or_the_config():
    from distributed.system import MEMORY_LIMIT
    from rpeg.infra.cluster import start_cluster

    from rpeg.config import ClusterConfig

    with start_cluster(n_workers=2, cluster_config=ClusterConfig()) as cl:
        limits = [w["memory_limit"] for w in cl.client.scheduler_info()["workers"].values()]
    # Dask's own machine/cgroup memory figure, split over the two workers (was 4 GiB)
    assert len(limits) == 2
    assert all(abs(m - MEMORY_LIMIT / 2) <= 0.01 * MEMORY_LIMIT for m in limits), limits
    with start_cluster(n_workers=1, cluster_config=ClusterConfig(worker_memory="1GiB")) as cl:
        (w,) = cl.client.scheduler_info()["workers"].values()
    assert w["memory_limit"] == 2**30


def test_tls_scheduler_needs_the_certificate_fields():
    from rpeg.infra.cluster import security_for

    from rpeg.config import ClusterConfig
    from rpeg.errors import ConfigError

    assert security_for(ClusterConfig(), "tcp://h:8786") is None
    with pytest.raises(ConfigError) as ei:
        security_for(ClusterConfig(tls_ca_file="ca.pem"), "tls://h:8786")
    assert [p.where for p in ei.value.problems] == ["cluster.tls_cert_file", "cluster.tls_key_file"]
    sec = security_for(
        ClusterConfig(tls_ca_file="ca.pem", tls_cert_file="c.pem", tls_key_file="k.pem"),
        "tls://h:8786",
    )
    assert sec.require_encryption and sec.tls_ca_file == "ca.pem"
    assert sec.tls_client_cert == "c.pem" and sec.tls_client_key == "k.pem"


@pytest.mark.gpu
def test_cuda_cluster_has_one_worker_per_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("dask_cuda", reason="needs the gpu extra (dask-cuda)")
    from rpeg.infra.cluster import start_cluster

    from rpeg.config import ClusterConfig

    with start_cluster(cluster_config=ClusterConfig(device_type="cuda")) as cl:
        assert len(cl.workers) == torch.cuda.device_count()
        seen = cl.client.run(lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES", ""))
        firsts = sorted(v.split(",")[0] for v in seen.values())
        assert firsts == [str(i) for i in range(torch.cuda.device_count())]


@pytest.mark.slow
def test_kill_9_takes_the_prefect_server_and_dask_workers_with_it(tmp_path):
    """The issue's case: Prefect's ephemeral API server (a uvicorn child) and a LocalCluster,
    started as ``rpeg train`` starts them, then ``kill -9`` of the command."""
    script = tmp_path / "train_like.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time
            os.environ.setdefault("DO_NOT_TRACK", "1")
            from rpeg.infra.lifeline import start_lifeline
            from rpeg.infra.cluster import start_cluster
            from prefect import flow

            @flow
            def hold():
                time.sleep(600)

            if __name__ == "__main__":
                start_lifeline()
                cl = start_cluster(n_workers=1)
                hold()
            """
        )
    )
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)
    cmd = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path)
    kids: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 180
        server = False
        while time.monotonic() < deadline and not server:
            time.sleep(1.0)
            for c in psutil.Process(cmd.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    kids[c.pid] = c.create_time()
                    server = server or "uvicorn" in " ".join(c.cmdline())
        if not server:
            pytest.skip("the ephemeral Prefect server did not start within 180 s here")
        time.sleep(2.0)  # one more lifeline poll
        for c in psutil.Process(cmd.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                kids[c.pid] = c.create_time()
        os.kill(cmd.pid, signal.SIGKILL)
        cmd.wait(10)
        left = []
        for pid, started in kids.items():
            if not _wait_gone(pid, 20, started):
                with contextlib.suppress(psutil.Error):
                    left.append(" ".join(psutil.Process(pid).cmdline())[:100])
        assert not left, f"still running after kill -9 of the command: {left}"
    finally:
        cmd.kill()
        _kill_if_same(kids)


#: the ``rpeg`` script, run by this interpreter
_RPEG = "import sys; from rpeg.cli import main; sys.exit(main())"


@pytest.mark.slow
def test_ctrl_c_stops_rpeg_train_promptly_with_exit_130_and_takes_its_services(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group) during ``rpeg train``: the
    command, not its services, takes it -- no worker tracebacks, the Prefect API still up for
    the flow's crash record (it used to die first: ~80 s of retries, then ``ConnectError``,
    exit 1) -- says what it kept, exits 130 within seconds, and leaves nothing running."""
    import yaml

    out = tmp_path / "out"
    cfg = {
        "workload": {"num_prompts": 4, "samples_per_prompt": 2, "max_response_tokens": 8},
        "task": {"heldout_size": 4},
        "optim": {"warmup_sft_steps": 0},
        # the untrained model earns no reward: the degenerate-training stop (20 such steps)
        # would end the run on its own before the interrupt on a fast step, so it only warns
        "runtime": {"steps": 500, "output_dir": str(out), "degenerate_steps_limit": 0},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)
    cmd = subprocess.Popen(
        [sys.executable, "-c", _RPEG, "train", str(tmp_path / "run.yaml"), "--quiet"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job has
    )
    kids: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 240
        metrics = out / "latest" / "metrics.jsonl"  # the run folder
        while time.monotonic() < deadline and cmd.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.5)
        assert cmd.poll() is None, cmd.communicate()[0][-3000:]
        for c in psutil.Process(cmd.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                kids[c.pid] = c.create_time()
        assert any(
            "uvicorn" in " ".join(psutil.Process(p).cmdline()) for p in kids if psutil.pid_exists(p)
        ), "the ephemeral API server was not started as a child"
        t = time.monotonic()
        os.killpg(cmd.pid, signal.SIGINT)
        text = cmd.communicate(timeout=60)[0]
        took = time.monotonic() - t
        assert cmd.returncode == 130, text[-3000:]
        assert took < 30, (took, text[-3000:])
        assert "interrupted: no checkpoints" in text, text[-3000:]
        for bad in ("Traceback", "KeyboardInterrupt", "ConnectError", "Error logging to API"):
            assert bad not in text, (bad, text[-3000:])
        left = []
        for pid, started in kids.items():
            if not _wait_gone(pid, 20, started):
                with contextlib.suppress(psutil.Error):
                    left.append(" ".join(psutil.Process(pid).cmdline())[:100])
        assert not left, f"still running after Ctrl-C: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cmd.pid, signal.SIGKILL)
        _kill_if_same(kids)


def test_rpeg_train_takes_sigint_when_started_with_it_ignored():
    """A background job of a non-interactive shell (``rpeg train ... &``, nohup) starts with
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler: ``kill -INT`` did
    nothing (the slow Ctrl-C test failed whenever pytest itself ran in the background)."""
    from rpeg.cli.train import _take_sigint

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _take_sigint()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, lambda *_: None)  # a handler someone set: kept
        _take_sigint()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
