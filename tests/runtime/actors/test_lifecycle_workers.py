"""Placing ranks when the scheduler lists no worker yet (workers starting, or restarting
after an earlier run's recovery): the actor set waits for them instead of dividing by zero."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rpeg.runtime.actors.lifecycle import ActorSet


class _Cluster:
    def __init__(self, listed, live):
        self.client = None
        self.listed, self.live, self.waits = listed, live, []

    @property
    def workers(self):
        return list(self.listed)

    def live_workers(self, expect, timeout_s=90.0, min_ok=1):
        self.waits.append((expect, timeout_s, min_ok))
        if self.live is None:
            raise TimeoutError("none answered")
        return list(self.live)


def _set(cluster):
    compiled = SimpleNamespace(num_devices=2)
    return ActorSet(SimpleNamespace(), compiled, cluster, async_rollout=False)


def test_listed_workers_are_used_as_they_are():
    c = _Cluster(["tcp://a", "tcp://b"], live=None)
    assert _set(c).listed_workers() == ["tcp://a", "tcp://b"] and c.waits == []


def test_no_listed_worker_waits_for_the_plans_devices():
    c = _Cluster([], live=["tcp://a", "tcp://b"])
    assert _set(c).listed_workers(timeout_s=5) == ["tcp://a", "tcp://b"]
    assert c.waits == [(2, 5, 2)]


def test_no_worker_ever_is_a_clear_error():
    c = _Cluster([], live=None)
    with pytest.raises(RuntimeError, match="no Dask worker joined.*needs 2.*cluster.n_workers"):
        _set(c).listed_workers(timeout_s=1)
