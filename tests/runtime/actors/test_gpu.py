"""Two steps of the distributed runtime with the rank on a CUDA device (skipped without one).

The plan is compiled for a GPU cluster of the catalog (one device), so the group's
``device_type`` is ``cuda`` and its precision bf16; the rank's model lives on ``cuda:0``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_two_steps_on_the_gpu(tmp_path):
    from rpeg.infra import start_cluster

    from rpeg.compile import compile_plan
    from rpeg.runtime.actors.driver import DistributedRun
    from tests.runtime.actors.conftest import tiny_config

    cfg = tiny_config(
        tmp_path,
        **{
            "cluster.name": "dgx-h100",
            "cluster.num_devices": 1,
            "cluster.n_workers": 1,
            "workload.precision": "bf16",
            "optim.warmup_sft_steps": 0,
        },
    )
    compiled = compile_plan(None, cfg)
    g = compiled.actor_groups[0]
    assert (g.device_type, g.dtype) == ("cuda", "bfloat16")
    cl = start_cluster(n_workers=1, torch_threads=1)
    run = DistributedRun(cfg, compiled, cl)
    try:
        run.start_actors()
        for step in range(2):
            m = {}
            for t in compiled.tasks:
                m.update(run.run_unit(step, t.name))
            run.release(step)
            assert m["num_tokens"] > 0
        (info,) = run.group(g.name).memory_info()
        assert info["device"].startswith("cuda") and info["peak_device_bytes"] > 0
    finally:
        run.close()
        cl.close()
