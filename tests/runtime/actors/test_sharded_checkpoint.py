"""Issue 26: a sharded (FSDP dp=2) trainer's checkpoint is written by its ranks, not shipped
through the flow process. Each rank writes its shards with torch.distributed.checkpoint into
the step's folder before the commit marker; the per-rank parts carry RNG states and versions
only; a fresh run restores the same weights from the shards."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def _config(tmp_path, ck):
    from tests.runtime.actors.conftest import tiny_config

    plan = {
        "cluster": "local-cpu",
        "model": "rpeg-tiny",
        "graph": {"builder": None},
        "staleness": 0,
        "units": {
            u: {"devices": "0-1"}
            for u in ("generate", "reward", "ref_logprob", "old_logprob", "advantage")
        }
        | {
            "train_actor": {"devices": "0-1", "engine": "fsdp"},
            "sync_weights": {"devices": "0-1"},
        },
    }
    cfg = tiny_config(
        tmp_path,
        **{
            "cluster.num_devices": 2,
            "cluster.n_workers": 2,
            "optim.warmup_sft_steps": 0,
            "runtime.checkpoint_url": ck,
            "runtime.checkpoint_every": 1,
            "runtime.run_id": "sharded-ck",
        },
    )
    return cfg.with_overrides({"plan": plan})


def test_an_fsdp_trainer_writes_its_own_shards_and_resumes_from_them(tmp_path):
    from rpeg.infra import start_cluster

    from rpeg.compile import compile_plan
    from rpeg.runtime.actors.checkpoint import CheckpointStore, loads
    from rpeg.runtime.actors.driver import DistributedRun

    ck = str(tmp_path / "ck")
    cfg = _config(tmp_path, ck)
    compiled = compile_plan(None, cfg)
    (g,) = [x for x in compiled.actor_groups if x.trainable]
    assert g.fsdp and g.dp == 2
    cl = start_cluster(n_workers=2, torch_threads=1)
    try:
        run = DistributedRun(cfg, compiled, cl)
        try:
            run.start_actors()
            for t in compiled.tasks:
                run.run_unit(0, t.name)
            run.release(0)
            saved = run.param_checksums()
            run.checkpoint(1, {"note": "test"})
        finally:
            run.close()
        meta, parts = CheckpointStore.for_run(cfg.runtime).latest()
        assert meta["sharded_groups"] == [g.name]
        for r in range(2):
            st = loads(parts[f"{g.name}-rank{r}.pt"])
            assert "module" not in st["actor"] and "optimizer" not in st["actor"]
            assert "torch_rng" in st["actor"]
        assert (tmp_path / "ck").exists()
        dcp = [p for p in (tmp_path / "ck").rglob(f"{g.name}.dcp") if p.is_dir()]
        assert len(dcp) == 1 and (dcp[0] / ".metadata").exists()

        resumed = cfg.with_overrides({"runtime.resume": True})
        run2 = DistributedRun(resumed, compiled, cl)
        try:
            run2.start_actors()
            assert run2.param_checksums() != pytest.approx(saved, rel=1e-9)
            assert run2.restore() == {"note": "test"}
            assert run2.param_checksums() == pytest.approx(saved, rel=1e-9)
            versions = run2.group(g.name)._all(lambda r, a: a.policy_version())
            assert versions == [1, 1]
        finally:
            run2.close()
    finally:
        cl.close()
