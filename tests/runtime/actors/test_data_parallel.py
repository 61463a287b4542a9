"""Two data-parallel ranks compute what one process computes on the whole batch (one step).

The same rollout batch (generated once) goes to a 1-rank actor and, split into whole prompt
groups, to a 2-rank group. After the advantage and training units: the advantages agree
(REINFORCE++ and PPO whiten over the whole batch, not per rank), the gradient norm after DDP
averaging equals the single-process one (loss normalised by the global token count) and the
updated weights agree. Two ranks generating half of the prompts each sample the single rank's
responses (per-row sampling seeds).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def _group(name, devices, algo):
    from tests.runtime.group_specs import group_spec

    roles = ["actor", "reference"] + (["critic"] if algo == "ppo" else [])
    return group_spec(name, devices, roles, ["actor"] + (["critic"] if algo == "ppo" else []))


def _weights(actor):
    from rpeg.runtime.actors.weight_sync import unpack

    buckets, _ = actor.get_weight_buckets(4 << 20).result()
    return unpack(buckets)


@pytest.mark.parametrize("algo", ["reinforce_pp", "ppo"])
def test_two_ranks_equal_one_rank_for_one_step(tmp_path, dask_cluster, make_config, algo):
    from rpeg.runtime.actors.programs import group_program
    from rpeg.runtime.actors.rank import RankActor
    from rpeg.runtime.actors.row_shards import prompt_shards, shard_groups
    from rpeg.runtime.batch import RolloutBatch
    from rpeg.runtime.data import PromptShard
    from tests.runtime.group_specs import unit_call as call

    cfg = make_config(
        tmp_path,
        **{
            "algorithm.name": algo,
            "workload.num_prompts": 4,
            "workload.micro_batch_size": 2,
            "workload.train_minibatches": 1,
            "workload.max_response_tokens": 8,
        },
    )
    one_g, dp_g = _group("one", [0], algo), _group("dp", [0, 1], algo)
    one_p, dp_p = (group_program(cfg, g, staleness=0) for g in (one_g, dp_g))
    client = dask_cluster.client
    w = dask_cluster.workers
    kinds = ["generate", "reward", "old_logprob", "ref_logprob"]
    kinds += ["values"] if algo == "ppo" else []
    train = ["advantage", "train_actor"] + (["train_critic"] if algo == "ppo" else [])
    with client.as_current():
        one = client.submit(RankActor, one_p, 0, actor=True, workers=[w[0]], pure=False).result()
        two = [
            client.submit(
                RankActor,
                dp_p,
                r,
                actor=True,
                workers=[w[r]],
                pure=False,
            ).result()
            for r in range(2)
        ]
        try:
            url = two[0].rendezvous().result()
            for p in [a.init_process_group(url) for a in two]:
                p.result()
            from rpeg.runtime.task_data import build_task_data

            cursor, _ = build_task_data(cfg.task)
            ex = cursor.next(cfg.workload.num_prompts)
            one.run_unit(0, call(cfg, kinds, PromptShard(0, tuple(ex)))).result()
            batch = one.get_batch(0).result()
            # each rank generating half of the prompts samples the single rank's responses
            gen = ["generate"]
            halves = zip(two, prompt_shards(ex, 2), strict=True)
            for p in [a.run_unit(0, call(cfg, gen, s)) for a, s in halves]:
                p.result()
            halves = RolloutBatch.concat([a.get_batch(0).result() for a in two])
            lengths = batch.response_mask.sum(-1)
            assert torch.equal(halves.response_mask.sum(-1), lengths)
            for i, n in enumerate(lengths.tolist()):
                assert torch.equal(halves.response_ids[i, :n], batch.response_ids[i, :n])
            idx = shard_groups(batch.size, 2, cfg.workload.samples_per_prompt)
            # unequal token counts per rank are what makes per-rank normalisation wrong
            for a, i in zip(two, idx, strict=True):
                a.put_batch(0, batch.select(torch.tensor(i))).result()
            m1 = one.run_unit(0, call(cfg, train)).result().metrics
            m2 = [p.result().metrics for p in [a.run_unit(0, call(cfg, train)) for a in two]]
            adv1 = one.get_batch(0).result()
            adv2 = RolloutBatch.concat([a.get_batch(0).result() for a in two])
            mask = adv1.response_mask.bool()
            r = adv1.response_ids.shape[1]
            a2 = torch.nn.functional.pad(adv2.advantages, (0, r - adv2.advantages.shape[1]))
            assert torch.allclose(adv1.advantages[mask], a2[mask], atol=1e-5)
            # gradient norm after the DDP average == the single-process gradient norm
            assert m2[0]["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
            assert m2[0]["grad_norm"] == pytest.approx(m2[1]["grad_norm"], rel=1e-9)
            # loss metrics reduce to the whole-batch values
            pg2 = sum(m["pg_loss"] for m in m2) / 2
            assert pg2 == pytest.approx(m1["pg_loss"], rel=1e-4, abs=1e-6)
            w1, w2 = _weights(one), _weights(two[0])
            diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
            # one AdamW step moves every weight by ~lr (g/|g|); round-off in tiny gradients
            # shows up as ~1% of lr, a per-rank normalisation as a different grad norm above
            assert diff < 5e-2 * cfg.optim.lr, diff
        finally:
            for a in [one, *two]:
                a.close().result()


def test_process_group_backend_follows_the_model_device():
    from rpeg.runtime.mesh import process_group_backend

    # NCCL only for CUDA tensors (it refuses CPU ones); the runtime's roles live on the CPU
    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("cuda") == "nccl"
