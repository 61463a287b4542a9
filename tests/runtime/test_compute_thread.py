"""One OpenMP team per process (rpeg.runtime.compute_thread): the thread that claims
``runtime.torch_threads`` runs torch at that count, every other thread at one, so no second
thread of a rank's process ever opens a team of its own; a Dask worker builds its rank on the
actor thread that runs it; oversubscribed workers get a passive OpenMP wait policy."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from rpeg.runtime.compute_thread import on_rank_thread, wait_policy_env

_OPENMP = "OpenMP" in torch.__config__.parallel_info()
_PROC = os.path.isdir("/proc/self/task")

# In a fresh process (torch's thread counts are per process): the main thread as a Dask
# worker's preload leaves it, a compute thread that claims 2 and stays alive, then big ops on
# the main thread and on a second thread. Prints each thread's torch count and the process's
# OS threads seen by the compute thread after its op and by the second thread after its op
# (a team's threads live as long as the thread that made it).
_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time, torch
    from rpeg.runtime import compute_thread as ct
    big = torch.randn(1500, 1500)
    def op():
        (big * 2 + 1).sum(); big @ big
    def tasks():
        time.sleep(0.3)  # threads that ended (the claim's short-lived one) are gone
        return len(os.listdir("/proc/self/task"))
    mode = sys.argv[1]
    if mode == "claim":
        ct.single_threaded()
    out, ready, done = {}, threading.Event(), threading.Event()
    def compute():
        if mode == "claim":
            ct.claim(2)
        else:
            torch.set_num_threads(2)
        op()
        out["compute"] = torch.get_num_threads()
        out["after_team"] = tasks()
        ready.set()
        done.wait()
    c = threading.Thread(target=compute); c.start(); ready.wait()
    op()
    out["main"] = torch.get_num_threads()
    def other():
        op(); out["other"] = torch.get_num_threads()
        out["after_others"] = tasks()
    t = threading.Thread(target=other); t.start(); t.join()
    done.set(); c.join()
    print(out)
    """
)


def _run(mode: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    env.pop("OMP_WAIT_POLICY", None)
    got = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    import ast

    return ast.literal_eval(got.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not (_OPENMP and _PROC), reason="torch's OpenMP backend on Linux")
def test_claimed_thread_keeps_its_count_and_no_other_thread_makes_a_team():
    got = _run("claim")
    assert got["compute"] == 2
    assert got["main"] == 1 and got["other"] == 1
    # the big ops of the main thread and of the second thread made no team: the only
    # thread added is the second thread itself
    assert got["after_others"] == got["after_team"] + 1


@pytest.mark.skipif(not (_OPENMP and _PROC), reason="torch's OpenMP backend on Linux")
def test_without_the_claim_a_second_thread_makes_a_second_team():
    # the control: torch.set_num_threads in the compute thread alone leaves the others at
    # the environment's 2, and their ops start teams of their own (the slowdown the module
    # removes: docs/measurements.md 2026-12-06)
    got = _run("plain")
    assert got["main"] == 2 and got["other"] == 2
    assert got["after_others"] >= got["after_team"] + 3  # + the thread + two teams


def test_claim_refuses_a_count_below_one():
    from rpeg.runtime.compute_thread import claim

    with pytest.raises(ValueError, match="runtime.torch_threads=0"):
        claim(0)


def test_on_rank_thread_runs_inline_outside_a_worker():
    assert on_rank_thread(threading.get_ident) == threading.get_ident()


@pytest.mark.parametrize(
    "processes,threads,cores,env,want",
    [
        (2, 1, 2, {}, {}),  # one thread each: no team, nothing to wait in
        (1, 2, 2, {}, {}),  # one process on its cores
        (2, 2, 2, {}, {"OMP_WAIT_POLICY": "PASSIVE"}),  # 4 threads on 2 cores
        (4, 4, 16, {}, {}),
        (5, 4, 16, {}, {"OMP_WAIT_POLICY": "PASSIVE"}),
        (2, 2, 2, {"OMP_WAIT_POLICY": "ACTIVE"}, {}),  # the user's own choice stays
    ],
)
def test_wait_policy_env(processes, threads, cores, env, want):
    assert wait_policy_env(processes, threads, cores, env) == want


def _worker_address():
    from distributed import get_worker

    return threading.get_ident(), get_worker().address


class _Built:
    """An actor that records the thread its constructor's on_rank_thread work ran on."""

    def __init__(self):
        self.constructor = threading.get_ident()
        self.built, self.address = on_rank_thread(_worker_address)

    def threads(self):

        return self.constructor, self.built, threading.get_ident(), self.address


def _main_thread_claim():
    from rpeg.runtime import compute_thread

    return compute_thread.claimed()


def test_a_worker_builds_on_the_actor_thread_and_its_own_threads_run_at_one(dask_cluster):
    client = dask_cluster.client
    w = sorted(client.scheduler_info()["workers"])[0]
    with client.as_current():
        actor = client.submit(_Built, actor=True, workers=[w], pure=False).result()
        constructor, built, method, address = actor.threads().result()
    assert built == method  # the build ran on the thread that runs the actor's methods
    assert address == w  # ... in the constructor's context: get_worker() answered
    assert constructor != method  # Dask's constructor thread is another one
    # the worker's preload (rpeg.runtime.actors.serializers.dask_setup) left its event loop at one
    assert set(client.run(_main_thread_claim).values()) == {1}


def _wait_policy():
    return os.environ.get("OMP_WAIT_POLICY")


def test_oversubscribed_local_cluster_workers_wait_passively(monkeypatch):
    # 2 workers x max(2, cores) torch threads: more threads than the host's cores
    from rpeg.infra import start_cluster

    from rpeg.runtime.cpu_binding import HOST_CORES

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with start_cluster(n_workers=2, torch_threads=max(2, len(HOST_CORES))) as cl:
        assert set(cl.client.run(_wait_policy).values()) == {"PASSIVE"}


@pytest.mark.skipif("OMP_WAIT_POLICY" in os.environ, reason="the environment sets a policy")
def test_local_cluster_workers_at_one_thread_keep_the_default_wait_policy(dask_cluster):
    assert set(dask_cluster.client.run(_wait_policy).values()) == {None}
