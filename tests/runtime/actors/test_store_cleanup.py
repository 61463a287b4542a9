"""Every distributed run left a /tmp/rpeg-store-* folder (issue 28 low probe: 111 on one
machine): a LocalCluster's workers now make their rendezvous stores in one folder of the
cluster's, removed when the cluster closes, after a failed run too."""

from __future__ import annotations

import os

import pytest
from rpeg.infra.cluster import start_cluster


def _store_on_worker() -> str:
    from rpeg.runtime.actors.rendezvous import master_store

    store, address = master_store()
    store.set("k", "v")  # the store works
    return address


@pytest.mark.slow
def test_the_stores_of_a_run_go_with_its_cluster():
    cl = start_cluster(n_workers=1)
    try:
        assert cl.store_dir and os.path.isdir(cl.store_dir)
        addresses = list(cl.client.run(_store_on_worker).values())
        path = addresses[0].removeprefix("file:")
        assert os.path.dirname(os.path.dirname(path)) == cl.store_dir
        assert os.path.basename(os.path.dirname(path)).startswith("rpeg-store-")
        raise RuntimeError("the run failed")  # close() runs as it does after a failure
    except RuntimeError:
        pass
    finally:
        cl.close()
    assert not os.path.exists(cl.store_dir)
