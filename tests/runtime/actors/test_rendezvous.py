"""The rendezvous store of a group on one machine opens no listening socket (a TCPStore
listens on every interface, which the LocalCluster of `rpeg train` must not expose)."""

from __future__ import annotations

import os

import psutil
import pytest

from rpeg.runtime.actors import rendezvous


def _listening_ports() -> set[tuple[str, int]]:
    me = os.getpid()
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="inet")
        if c.pid == me and c.status == psutil.CONN_LISTEN
    }


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.1.1"])
def test_loopback_store_listens_nowhere_and_ranks_share_it(monkeypatch, host):
    monkeypatch.setattr(rendezvous, "worker_host", lambda: host)
    before = _listening_ports()
    store, addr = rendezvous.master_store(timeout_s=10)
    assert addr.startswith("file:"), addr
    assert _listening_ports() == before
    other = rendezvous.join_store(addr, timeout_s=10)
    store.set("rank0", "a")
    other.set("rank1", "b")
    assert other.get("rank0") == b"a" and store.get("rank1") == b"b"
    # the folder holding the store is private to this user
    assert os.stat(os.path.dirname(addr[len("file:") :])).st_mode & 0o077 == 0


@pytest.mark.parametrize("host", ["10.1.2.3", "192.168.0.7", "example.org", "::2"])
def test_other_hosts_are_not_loopback(host):
    assert not rendezvous._is_loopback(host)
