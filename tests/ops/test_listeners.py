"""Listeners across nodes bind the address they are meant for, never every interface: the
ranks' rendezvous store (a TCPStore on a worker's non-loopback address) and a Slurm
cluster's scheduler (cluster.interface)."""

from __future__ import annotations

import os

import psutil
import pytest


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return a.address
    return None


def _listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="inet")
        if c.pid == pid and c.status == psutil.CONN_LISTEN
    }


def test_rendezvous_store_listens_on_the_workers_address_only(monkeypatch):
    from rpeg.runtime.actors import rendezvous

    host = _non_loopback_ipv4()
    if host is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    monkeypatch.setattr(rendezvous, "worker_host", lambda: host)
    before = _listening(os.getpid())
    store, addr = rendezvous.master_store(timeout_s=10)
    new = _listening(os.getpid()) - before
    assert addr == f"{host}:{store.port}"
    assert new == {(host, store.port)}, new  # not 0.0.0.0 / ::
    other = rendezvous.join_store(addr, timeout_s=10)
    store.set("rank0", "a")
    other.set("rank1", "b")
    assert other.get("rank0") == b"a" and store.get("rank1") == b"b"
