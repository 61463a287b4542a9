"""The data plane: batches move actor to actor (the flow process only plans the slices),
tensors travel zero-copy and packed, weights move by a collective, streaming units hand
chunks on, and every compiled field the runtime reads changes what it does."""

from __future__ import annotations

import random

import pytest
import torch

from rpeg.compile import compile_plan
from rpeg.runtime.actors.dataplane import Holding, plan_pull, shard_ranges, tensor_bytes


# --------------------------------------------------------------------------- planning (pure)
@pytest.mark.parametrize("seed", range(6))
def test_plan_pull_gives_each_rank_its_rows_of_the_concatenated_batch(seed):
    rnd = random.Random(seed)
    gsz = rnd.choice([1, 2, 4])
    src_dp, src_tp = rnd.choice([1, 2, 3]), rnd.choice([1, 2])
    groups = rnd.randint(src_dp, 9)
    sizes = tuple(b - a for a, b in shard_ranges(groups * gsz, src_dp, gsz))
    src = Holding("g0", src_dp, src_tp, sizes)
    # the reference: every producer's local rows, concatenated, then the consumer's shard
    local = [list(range(a, b)) for a, b in src.ranges()]
    whole = [x for rows in local for x in rows]
    dst_dp, dst_tp = rnd.choice([1, 2, 3]), rnd.choice([1, 2])
    if dst_dp > groups:
        dst_dp = groups
    slices, got_sizes = plan_pull(src, dst_dp, dst_tp, gsz)
    want = shard_ranges(len(whole), dst_dp, gsz)
    assert len(slices) == dst_dp * dst_tp
    for rank, parts in enumerate(slices):
        rows = []
        for prod, a, b in parts:
            assert 0 <= prod < src_dp * src_tp
            rows += local[prod // src_tp][a:b]  # tp replicas hold the rows of their dp index
        lo, hi = want[rank // dst_tp]
        assert rows == whole[lo:hi]
        assert got_sizes[rank // dst_tp] == hi - lo
        # whole prompt groups only
        assert lo % gsz == 0 and hi % gsz == 0


def _batch(b=4, p=5, r=7, seed=0):
    from rpeg.runtime.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    pl = torch.randint(1, p + 1, (b,), generator=g)
    rl = torch.randint(0, r + 1, (b,), generator=g)
    pm = (torch.arange(p)[None] >= (p - pl)[:, None]).long()
    rm = (torch.arange(r)[None] < rl[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.randint(1, 50, (b, p), generator=g) * pm,
        prompt_mask=pm,
        response_ids=torch.randint(1, 50, (b, r), generator=g) * rm,
        response_mask=rm,
        sample_logprobs=torch.randn(b, r, generator=g) * rm,
        policy_version=torch.zeros(b, dtype=torch.long),
        group_ids=torch.arange(b) // 2,
        prompts=[f"p{i}" for i in range(b)],
        responses=[f"r{i}" for i in range(b)],
        reference_answers=[str(i) for i in range(b)],
        rewards=torch.randn(b, generator=g).to(torch.bfloat16),
        temperature=0.7,
    )


def test_batch_serializer_is_bit_exact_and_sends_only_real_tokens():
    import dataclasses

    from distributed.protocol import deserialize, serialize

    from rpeg.runtime.actors import serializers

    serializers.register()
    b = _batch()
    header, frames = serialize(b)
    assert header["serializer"] == "dask"  # not pickled in-band
    got = deserialize(header, [bytearray(memoryview(f).cast("B")) for f in frames])
    for f in dataclasses.fields(b):
        x, y = getattr(b, f.name), getattr(got, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name
    # packed: per-token fields carry sum(len) values, prompts sum(prompt len)
    r, p = int(b.response_mask.sum()), int(b.prompt_mask.sum())
    expect = (
        2 * 4 * 4  # the two length vectors (int32)
        + 2 * 8 * p  # prompt ids + mask (int64), packed
        + 2 * 8 * r  # response ids + mask (int64), packed
        + 4 * r  # sample log-probs (fp32), packed
        + 2 * 8 * 4  # policy_version + group_ids
        + 2 * 4  # rewards (bf16)
    )
    assert serializers.wire_bytes(b) == expect < tensor_bytes(b)


# --------------------------------------------------------------------------- compiled fields
def _cfg(tmp_path, **over):
    from tests.runtime.actors.conftest import tiny_config

    return tiny_config(tmp_path, **{"optim.warmup_sft_steps": 0, **over})


def test_staleness_bound_comes_from_the_compiled_step(tmp_path):
    """k is the compiled step's: k=1 admits a slot one version ahead of the generator's
    weights, k=0 does not; the ranks get the same k (their colocated lag test)."""
    import dataclasses

    from rpeg.runtime.step import staleness as st
    from rpeg.runtime.step.plan import StepPlan

    cfg = _cfg(tmp_path, **{"runtime.max_staleness": 1, "cluster.num_devices": 2})
    B = cfg.workload.samples_per_step
    admitted = {}
    for k in (0, 1):
        step = dataclasses.replace(compile_plan(None, cfg), staleness=k)
        state = st.StalenessState(k=StepPlan.from_compiled(step).k, batch_size=B)
        state.handle(st.RequestSlot(0, B))  # slot 0
        (ins,) = state.handle(st.RequestSlot(0, B))  # slot 1 with weights v0: lag 1
        admitted[k] = isinstance(ins, st.Admit)
    assert admitted == {0: False, 1: True}


def test_concurrent_with_decides_what_overlaps(tmp_path):
    from rpeg.ir import build
    from rpeg.plan import colocated_plan

    cfg = _cfg(tmp_path, **{"cluster.num_devices": 2})
    plan = colocated_plan(build("grpo"), num_devices=2, builder="grpo")
    units = dict(plan.units)
    units["ref_logprob"] = units["ref_logprob"].model_copy(update={"devices": (1,)})
    units["old_logprob"] = units["old_logprob"].model_copy(update={"devices": (0,)})
    step = compile_plan(plan.model_copy(update={"units": units}), cfg)
    # disjoint devices, no dependency path, same phase: they overlap
    assert step.task("old_logprob").concurrent_with == ("ref_logprob",)
    assert "ref_logprob" not in step.wait_list("old_logprob")
    import dataclasses

    tasks = tuple(
        dataclasses.replace(t, concurrent_with=()) if t.name == "old_logprob" else t
        for t in step.tasks
    )
    step = dataclasses.replace(step, tasks=tasks)
    assert "ref_logprob" in step.wait_list("old_logprob")  # no longer concurrent: it waits


def test_fields_the_runtime_cannot_honour_are_refused_by_name(tmp_path):
    from rpeg.compile.checks import check_step
    from rpeg.errors import ConfigError

    cfg = _cfg(tmp_path, **{"runtime.max_staleness": 1, "cluster.num_devices": 2})
    import dataclasses

    step = compile_plan(None, cfg)
    R = dataclasses.replace
    bad = {"generate": {"micro_batch_size": 4}, "reward": {"fused": True}}
    step = R(
        step,
        actor_groups=(R(step.actor_groups[0], backend="nccl"), *step.actor_groups[1:]),
        tasks=tuple(R(t, **bad.get(t.name, {})) for t in step.tasks),
        weight_sync=R(step.weight_sync, every_steps=3),  # > k+1 = 2
    )
    with pytest.raises(ConfigError) as ei:
        check_step(step)
    text = str(ei.value)
    for field in (
        "actor_groups[0] (g0).backend",
        "(generate).micro_batch_size",
        "(reward).fused",
        "weight_sync.every_steps",
    ):
        assert field in text


# --------------------------------------------------------------------------- on a cluster
@pytest.mark.slow
def test_batches_go_actor_to_actor_and_weights_by_collective(tmp_path, dask_cluster):
    """k=1 on a generator worker and a trainer worker: the driver's tensor bytes stay 0 while
    the trainer receives exactly the rollout batch from the generator; the weights reach the
    generator by broadcast, in ``bucket_bytes`` buckets."""
    from rpeg.runtime.actors.driver import DistributedRun

    cfg = _cfg(tmp_path, **{"runtime.max_staleness": 1, "cluster.num_devices": 2})
    compiled = compile_plan(None, cfg)
    gen, trainer = compiled.rollout_group, compiled.trainer_group
    assert gen != trainer
    run = DistributedRun(cfg, compiled, dask_cluster)
    run.start_actors()
    try:
        run.sync_weights(-1)
        with run.client.as_current():
            g0, t0 = run.groups[gen][0], run.groups[trainer][0]
            metrics = []
            for step in range(2):
                got_before = t0.received().result()
                m = dict(run.rollout(step))
                produced = tensor_bytes(g0.get_batch(step).result())  # the test's own fetch
                run.driver_bytes.clear()
                m.update(run.take(step))
                for t in compiled.tasks_in("train"):
                    if "sync_weights" not in t.kinds:
                        m.update(run.run_unit(step, t.name))
                m.update(run.sync_weights(step))
                m.update(run.data_plane_metrics(step))
                metrics.append(m)
                assert t0.received().result() - got_before == produced > 0
        for m in metrics:
            assert m["driver_bytes"] == 0.0
            assert m["actor_to_actor_bytes"] == produced
            assert m["batch_bytes"] >= produced
            assert m["weight_sync_bytes"] > 0
        with run.client.as_current():
            assert g0.weights_checksum().result() == t0.weights_checksum().result()
            assert g0.engine_version().result() == t0.policy_version().result() == 2
            # a smaller bucket: more broadcasts, the same bytes
            small = t0.send_weights(64 << 10)
            recv = g0.recv_weights(64 << 10)
            s = small.result()
            recv.result()
        assert s["weight_sync_bytes"] == metrics[1]["weight_sync_bytes"]
        assert s["buckets"] > metrics[1]["weight_sync_buckets"]
    finally:
        run.close()


@pytest.mark.slow
def test_micro_batch_size_sets_the_number_of_forward_calls(tmp_path, dask_cluster):
    from rpeg.runtime.actors.driver import DistributedRun

    cfg = _cfg(tmp_path, **{"cluster.num_devices": 1})  # 2 prompts x 2 samples
    calls = {}
    for mbs in (1, 4):
        import dataclasses

        compiled = compile_plan(None, cfg)
        R = dataclasses.replace
        # by count: unpacked, no token budget (a packed unit's budget: test_packing.py)
        by_count = {
            "micro_batch_size": mbs,
            "seq_packing": False,
            "max_tokens_per_micro_batch": None,
        }
        tasks = tuple(R(t, **by_count) if t.name == "ref_logprob" else t for t in compiled.tasks)
        compiled = R(compiled, tasks=tasks)
        run = DistributedRun(cfg, compiled, dask_cluster)
        run.start_actors()
        try:
            for t in compiled.tasks:
                m = run.run_unit(0, t.name)
                if t.name == "ref_logprob":
                    calls[mbs] = m["forward_calls"]
        finally:
            run.close()
    assert calls == {1: 4.0, 4: 1.0}  # 4 samples: one call per sample vs one for all


# Streaming hands out prompt groups as their samples finish. A random-init model never stops
# before the cap and a fully warmed-up one always answers in 2-3 tokens: either way every
# group ends at the same step and there is nothing to stream. Five supervised warm-up steps
# (cached) leave lengths of 2-17 tokens (mean ~4), a long tail as RL responses have.
STREAMING = {
    "cluster.num_devices": 1,
    "workload.num_prompts": 16,
    "workload.samples_per_prompt": 2,
    "workload.max_response_tokens": 32,
    "optim.warmup_sft_steps": 5,
}


@pytest.mark.slow
def test_a_streaming_unit_rewards_chunks_before_generation_ends(tmp_path, dask_cluster):
    from rpeg.compile import resolve
    from rpeg.ir import fuse, to_dict
    from rpeg.plan import colocated_plan
    from rpeg.runtime.actors.driver import DistributedRun

    cfg = _cfg(tmp_path, **STREAMING)
    graph, _ = resolve(None, cfg)
    g = fuse(graph, ["generate", "reward"], streaming=True, name="rollout")
    plan = colocated_plan(g, num_devices=1, micro_batch_size=4).with_inline_graph(to_dict(g))
    compiled = compile_plan(plan, cfg)
    t = compiled.task("rollout")
    assert t.streaming and t.stream_chunk_prompts == 4  # a quarter of 16 prompts
    run = DistributedRun(cfg, compiled, dask_cluster)
    run.start_actors()
    try:
        m = run.run_unit(0, "rollout")
        with run.client.as_current():
            batch = run.groups[t.group][0].get_batch(0).result()
    finally:
        run.close()
    assert m["stream_chunks"] >= 2.0 and batch.size == 16 * cfg.workload.samples_per_prompt
    assert batch.rewards is not None and batch.rewards.shape[0] == batch.size
    spans = [s for s in run.timeline.stage_spans if s["unit"] == "rollout"]
    gen_end = max(s["end_s"] for s in spans if s["stage"] == "generate")
    first_reward = min(s["start_s"] for s in spans if s["stage"] == "reward")
    assert first_reward < gen_end  # reward of chunk 0 ran before generation finished


@pytest.mark.slow
def test_a_streaming_unit_with_a_forward_on_two_data_parallel_ranks(tmp_path, dask_cluster):
    """dp = 2: the ranks finish their prompts at different decode steps, so the unit's
    forward (reference log-probs: a collective per call) runs once on the joined batch while
    the rule reward still runs per chunk; both ranks release the same number of chunks."""
    from rpeg.compile import resolve
    from rpeg.ir import fuse, to_dict
    from rpeg.plan import colocated_plan
    from rpeg.runtime.actors.driver import DistributedRun

    cfg = _cfg(tmp_path, **{**STREAMING, "cluster.num_devices": 2})
    graph, _ = resolve(None, cfg)
    g = fuse(graph, ["generate", "reward", "ref_logprob"], streaming=True, name="rollout")
    plan = colocated_plan(g, num_devices=2, micro_batch_size=4).with_inline_graph(to_dict(g))
    compiled = compile_plan(plan, cfg)
    t = compiled.task("rollout")
    assert t.streaming and t.stream_chunk_prompts == 2  # a quarter of a rank's 8 prompts
    run = DistributedRun(cfg, compiled, dask_cluster)
    run.start_actors()
    try:
        m = run.run_unit(0, "rollout")
        with run.client.as_current():
            batches = [a.get_batch(0).result() for a in run.groups[t.group]]
    finally:
        run.close()
    assert m["stream_chunks"] == 4.0  # ceil(8 / 2) on each rank
    for b in batches:
        assert b.size == 8 * cfg.workload.samples_per_prompt
        assert b.rewards is not None and b.ref_logprobs is not None
        assert len(set(b.group_ids.tolist())) == 8  # groups kept apart across chunks
    spans = [s for s in run.timeline.stage_spans if s["unit"] == "rollout" and s["rank"] == 0]
    gen_end = max(s["end_s"] for s in spans if s["stage"] == "generate")
    assert min(s["start_s"] for s in spans if s["stage"] == "reward") < gen_end
    ref = [s for s in spans if s["stage"] == "ref_logprob"]
    assert len(ref) == 1 and ref[0]["start_s"] >= gen_end  # once, after the decode


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["fsdp_dp2", "tp2"])
def test_weight_sync_from_a_sharded_trainer(tmp_path, layout):
    """The trainer on two ranks (FSDP2 dp=2, or tp=2), the generator on a third: after a
    training step and a sync, the generator's full weights equal the trainer's gathered ones."""
    from rpeg.infra import start_cluster

    from rpeg.ir import bound_async, build
    from rpeg.plan import disaggregated_plan
    from rpeg.runtime.actors.driver import DistributedRun

    cfg = _cfg(
        tmp_path,
        **{"runtime.max_staleness": 1, "cluster.num_devices": 3, "runtime.cpu_binding": "spread"},
    )
    tp = 2 if layout == "tp2" else 1
    plan = disaggregated_plan(
        bound_async(build("grpo"), 1), gen_devices=1, train_devices=2, tp=tp, builder=None
    )
    if layout == "fsdp_dp2":
        units = {
            k: (u.model_copy(update={"engine": "fsdp"}) if k.startswith("train") else u)
            for k, u in plan.units.items()
        }
        plan = plan.model_copy(update={"units": units})
    compiled = compile_plan(plan, cfg, cluster_devices=3)
    g = compiled.group(compiled.trainer_group)
    assert (g.dp, g.tp, g.fsdp) == ((2, 1, True) if layout == "fsdp_dp2" else (1, 2, False))
    with start_cluster(n_workers=3, torch_threads=1) as cl:
        run = DistributedRun(cfg, compiled, cl)
        run.start_actors()
        try:
            # runtime.cpu_binding "spread": each worker on its own cores of this host, whatever
            # its core count ("auto" would bind only more workers than cores)
            from rpeg.runtime.cpu_binding import HOST_CORES

            with run.client.as_current():
                cores = [a.layout_info().result()["cpu_cores"] for a in run.groups[g.name]]
            assert all(c and set(c) <= set(HOST_CORES) for c in cores)
            if len(HOST_CORES) >= 2:
                assert cores[0] != cores[1]  # the trainer's two ranks never share a core
            run.sync_weights(-1)
            run.rollout(0)
            run.take(0)
            for t in compiled.tasks_in("train"):
                if "sync_weights" not in t.kinds:
                    run.run_unit(0, t.name)
            m = run.sync_weights(0)
            assert m["weight_sync_bytes"] > 0
            with run.client.as_current():
                gen = run.groups[compiled.rollout_group][0].weights_checksum()
                train = [a.weights_checksum() for a in run.groups[g.name]]  # a gather: all ranks
                got, want = gen.result(), [f.result() for f in train]
            assert want[0] == want[1] and got == want[0]
        finally:
            run.close()


@pytest.mark.slow
def test_streaming_across_groups_overlaps_log_probs_with_generation(tmp_path, dask_cluster):
    """k=0, generator and trainer on separate workers, a streaming rollout unit: the
    trainer's reference log-prob pass runs on each chunk while the generator produces the
    next, so it starts before generation ends; the batch still reaches the trainer whole and
    not through the driver."""
    from rpeg.compile import resolve
    from rpeg.ir import fuse, to_dict
    from rpeg.plan import disaggregated_plan
    from rpeg.runtime.actors.driver import DistributedRun

    cfg = _cfg(tmp_path, **{**STREAMING, "cluster.num_devices": 2})
    graph, _ = resolve(None, cfg)
    g = fuse(graph, ["generate", "reward"], streaming=True, name="rollout")
    plan = disaggregated_plan(g, gen_devices=1, train_devices=1, micro_batch_size=4)
    compiled = compile_plan(plan.with_inline_graph(to_dict(g)), cfg)
    assert compiled.rollout_group != compiled.trainer_group and compiled.staleness == 0
    run = DistributedRun(cfg, compiled, dask_cluster)
    run.start_actors()
    try:
        run.sync_weights(-1)
        run.driver_bytes.clear()
        m = dict(run.rollout(0))
        m.update(run.take(0))
        trainer = run.group(compiled.trainer_group)
        calls = []
        for name in ("run_unit", "run_units"):
            real = getattr(trainer, name)
            setattr(
                trainer, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k)
            )
        train_units = [t.name for t in compiled.tasks_in("train") if "sync_weights" not in t.kinds]
        for name in train_units:
            m.update(run.run_unit(0, name))
        with run.client.as_current():
            batch = run.groups[compiled.trainer_group][0].get_batch(0).result()
    finally:
        run.close()
    # the streamed first unit ran on the chunks; the rest of its chain went in one call
    head = train_units[0]
    assert len(run.units.chains[head]) == len(train_units) > 2
    assert calls == ["run_units"]
    assert batch.size == 16 * cfg.workload.samples_per_prompt
    assert batch.ref_logprobs is not None and batch.advantages is not None
    assert run.data_plane_metrics(0)["driver_bytes"] == 0.0
    spans = run.timeline.stage_spans
    gen_end = max(s["end_s"] for s in spans if s["stage"] == "generate")
    ref = [s for s in spans if s["stage"] == "ref_logprob"]
    assert len(ref) >= 2  # one pass per streamed chunk (prompts released as they finish)
    assert min(s["start_s"] for s in ref) < gen_end  # started before generation ended
