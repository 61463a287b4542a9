"""A Dask dashboard on every interface is warned about (issue 28: ``":8787"`` listened on all
interfaces without a word)."""

from __future__ import annotations

import pytest
from rpeg.infra.cluster import listens_on_all_interfaces, start_cluster


@pytest.mark.parametrize("addr", [":8787", "8787", "0.0.0.0:8787", "[::]:8787", "tcp://:1"])
def test_every_interface_forms(addr):
    assert listens_on_all_interfaces(addr)


@pytest.mark.parametrize("addr", ["127.0.0.1:8787", "localhost:0", "[::1]:8787", "10.0.0.5:1"])
def test_one_interface_forms(addr):
    assert not listens_on_all_interfaces(addr)


def test_start_cluster_warns_before_starting_anything(monkeypatch):
    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr("rpeg.infra.cluster.configure_dask", stop)  # nothing starts
    with pytest.warns(UserWarning, match="every network interface"), pytest.raises(Stop):
        start_cluster(dashboard_address=":8787")
