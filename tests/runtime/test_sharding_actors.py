"""Rank actors of a sharded group on a Dask LocalCluster (2 CPU workers, gloo): a tp=2 group
decodes the same rows on both ranks and trains; an fsdp dp=2 group decodes different prompts
(its ranks keep stepping together until both are done), trains, syncs and evaluates.
Each rank reports what it holds through ``RankActor.layout_info``."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.group_specs import unit_call as call

pytestmark = pytest.mark.slow

KINDS = ["generate", "reward", "old_logprob", "ref_logprob", "advantage", "train_actor"]


@pytest.fixture(scope="module")
def cluster():
    from rpeg.infra import start_cluster

    cl = start_cluster(n_workers=2, torch_threads=1)
    yield cl
    cl.close()


def _config(tmp_path):
    from rpeg.config import RunConfig

    return RunConfig.from_dict(
        {
            "algorithm": {"name": "grpo", "kl_coef": 0.1},
            "workload": {
                "num_prompts": 2,
                "samples_per_prompt": 2,
                "max_response_tokens": 6,
                "micro_batch_size": 2,
                "train_minibatches": 1,
            },
            "model": {"tiny_shape": {"hidden_size": 64, "intermediate_size": 128}},
            "task": {"heldout_size": 2},
            "runtime": {"output_dir": str(tmp_path / "out")},
        }
    )


def _group(name, **layout):
    from tests.runtime.group_specs import group_spec

    return group_spec(name, [0, 1], ["actor", "reference"], ["actor"], **layout)


def _start(cluster, cfg, group):
    from rpeg.runtime.actors.programs import group_program
    from rpeg.runtime.actors.rank import RankActor

    client, w = cluster.client, cluster.workers
    program = group_program(cfg, group, staleness=0)
    ranks = [
        client.submit(RankActor, program, r, actor=True, workers=[w[r]], pure=False).result()
        for r in range(2)
    ]
    url = ranks[0].rendezvous().result()
    for f in [a.init_process_group(url) for a in ranks]:
        f.result()
    return ranks


def _all(ranks, method, *args, per_rank=None):
    futs = [
        getattr(a, method)(*(args + (per_rank[i] if per_rank else ()))) for i, a in enumerate(ranks)
    ]
    return [f.result() for f in futs]


def test_tp2_ranks_decode_the_same_rows_and_train(tmp_path, cluster):
    from rpeg.runtime.data import PromptShard
    from rpeg.runtime.task_data import build_task_data

    cfg = _config(tmp_path)
    with cluster.client.as_current():
        ranks = _start(cluster, cfg, _group("tp", dp=1, tp=2, fsdp=False))
        try:
            cursor, _ = build_task_data(cfg.task)
            ex = PromptShard(0, tuple(cursor.next(cfg.workload.num_prompts)))
            ms = [u.metrics for u in _all(ranks, "run_unit", 0, call(cfg, KINDS, ex))]
            b0, b1 = _all(ranks, "get_batch", 0)
            assert torch.equal(b0.response_ids, b1.response_ids)  # same seed, same shards
            assert ms[0]["grad_norm"] == pytest.approx(ms[1]["grad_norm"], rel=1e-6)
            assert ms[0]["pg_loss"] == pytest.approx(ms[1]["pg_loss"], rel=1e-6, abs=1e-7)
            info = _all(ranks, "layout_info")
            for i in info:
                assert (i["dp"], i["tp"]) == (1, 2)
                held, full = i["param_bytes_per_rank"], i["full_param_bytes"]
                assert held["actor"] < 0.8 * full["actor"]
                assert held["reference"] < 0.8 * full["reference"]
            sums = _all(ranks, "param_checksum")
            assert sums[0] == pytest.approx(sums[1], rel=1e-9)
        finally:
            _all(ranks, "close")


def test_fsdp_dp2_ranks_step_together_train_sync_and_evaluate(tmp_path, cluster):
    from rpeg.runtime.actors.weight_sync import unpack
    from rpeg.runtime.data import PromptShard
    from rpeg.runtime.task_data import build_task_data

    cfg = _config(tmp_path)
    with cluster.client.as_current():
        ranks = _start(cluster, cfg, _group("fsdp", dp=2, tp=1, fsdp=True))
        try:
            cursor, _ = build_task_data(cfg.task)
            ex = cursor.next(cfg.workload.num_prompts)
            halves = [
                (call(cfg, KINDS, PromptShard(0, tuple(ex[:1]))),),
                (call(cfg, KINDS, PromptShard(1, tuple(ex[1:]))),),
            ]
            res = _all(ranks, "run_unit", 0, per_rank=halves)
            ms = [u.metrics for u in res]
            assert ms[0]["grad_norm"] == pytest.approx(ms[1]["grad_norm"], rel=1e-6)
            info = _all(ranks, "layout_info")
            for i in info:
                held, full = i["param_bytes_per_rank"], i["full_param_bytes"]
                assert held["actor"] <= 0.55 * full["actor"]
            (b0, v0), (b1, _) = _all(ranks, "get_weight_buckets", 1 << 20)
            w0, w1 = unpack(b0), unpack(b1)
            assert v0 == 1 and all(torch.equal(w0[k], w1[k]) for k in w0)
            n_full = sum(
                t.numel() * t.element_size() for k, t in w0.items() if k != "lm_head.weight"
            )
            assert n_full == info[0]["full_param_bytes"]["actor"]
            acc = _all(ranks, "evaluate")
            assert acc[0] == acc[1]
            # checkpoint of the shards, resumed by a tp=2 group on the same workers
            url = str(tmp_path / "shards")
            _all(ranks, "save_shards", url)
            saved = _all(ranks, "param_checksum")[0]
            state = _all(ranks, "state_bytes")  # the store's format: full weights, any layout
        finally:
            _all(ranks, "close")
        ranks = _start(cluster, cfg, _group("tp", dp=1, tp=2, fsdp=False))
        try:
            assert _all(ranks, "param_checksum")[0] != pytest.approx(saved, rel=1e-9)
            assert _all(ranks, "load_shards", url) == [1, 1]
            assert _all(ranks, "param_checksum") == [pytest.approx(saved, rel=1e-9)] * 2
            assert _all(ranks, "engine_version") == [1, 1]
            whole = PromptShard(0, tuple(ex))
            ms = [
                u.metrics for u in _all(ranks, "run_unit", 1, call(cfg, KINDS, whole))
            ]  # trains on
            assert ms[0]["grad_norm"] == pytest.approx(ms[1]["grad_norm"], rel=1e-6)
            assert _all(ranks, "policy_version") == [2, 2]
            assert _all(ranks, "load_state_bytes", per_rank=[(b,) for b in state]) == [1, 1]
            assert _all(ranks, "param_checksum") == [pytest.approx(saved, rel=1e-9)] * 2
        finally:
            _all(ranks, "close")
