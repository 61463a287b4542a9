"""The collectives RPEG's pp/cp ranks issue from Python, priced call by call (rpeg.perf.passes):
context parallelism's key/value gathers and log-prob sums and its per-tensor gradient sums,
pipelined dp replicas' per-tensor gradient averages and the pipeline group's norm/metrics
collectives, each at the cluster's ``collective_latency_s`` (gloo on CPU workers: the call
after compute wakes gloo's threads, benchmarks/bench_collectives.py). Engines that bucket
(Megatron, FSDP: the published systems) keep the bucketed price. A training micro-batch holds
at most one optimizer step's rows."""

import pytest

from rpeg import specs
from rpeg.ir import builders
from rpeg.perf import Workload, passes, predict
from rpeg.perf.calibration import SHIPPED
from rpeg.perf.time_sharing import unit_context
from rpeg.perf.units import UnitContext
from rpeg.plan import colocated_plan

WL = Workload(
    num_prompts=16,
    samples_per_prompt=8,
    mean_prompt_tokens=6,
    max_response_tokens=16,
    mean_response_tokens=3,
    train_minibatches=4,
    precision="fp32",
)


def _ctx(cluster="local-cpu", model="rpeg-tiny", n=2, **unit):
    g = builders.build("grpo")
    plan = colocated_plan(g, cluster, num_devices=n, model=model)
    for name, u in plan.units.items():
        if name in ("train_actor", "ref_logprob", "old_logprob"):
            plan.units[name] = u.model_copy(update=dict(micro_batch_size=16, **unit))
    return g, plan, UnitContext(plan, WL, specs.cluster(cluster), specs.model(model), SHIPPED)


def test_local_cpu_states_its_gloo_collective_latency():
    cl = specs.cluster("local-cpu")
    assert cl.collective_latency_s == pytest.approx(0.7e-3)
    assert cl.collective_latency_s > cl.link("domain").latency_s  # the link's: 150 us
    assert specs.cluster("dgx-h100").collective_latency_s is None  # NCCL: the link's own


def test_cp_gradient_sum_pays_one_call_per_parameter_tensor():
    _, plan, c = _ctx(cp=2)
    u = plan.units["train_actor"]
    s = passes.pass_shape(c, u, True)
    w = 0.05  # GB of weights as held
    _, own = passes.context_grad_sum_s(c, s, 0, w, own=True)
    _, bucketed = passes.context_grad_sum_s(c, s, 0, w, own=False)
    m = specs.model("rpeg-tiny")
    assert passes.param_tensors(m, 1) == m.hf_tensors == 38  # rpeg-tiny: 4 layers x 9 + 2
    lat = c.cluster.collective_latency_s
    # hand-worked: per optimizer step 38 all-reduces at p = 2, each 2 latencies, plus bytes
    assert own - bucketed == pytest.approx(
        WL.train_minibatches * (38 * 2 * lat - 2 * c.cluster.link("domain").latency_s), rel=1e-6
    )


def test_cp_log_prob_sums_only_on_rpeg_ranks():
    _, plan, c = _ctx(cp=2)
    s = passes.pass_shape(c, plan.units["ref_logprob"], False)
    _, own = passes.context_parallel_s(c, s, 0, own=True)
    _, other = passes.context_parallel_s(c, s, 0, own=False)
    # one [b, R] all-reduce per micro-batch, at least 2 collective latencies each
    assert own - other >= s.micro_batches * 2 * c.cluster.collective_latency_s
    st = passes.pass_shape(c, plan.units["train_actor"], True)
    _, own_t = passes.context_parallel_s(c, st, 0, own=True)
    _, other_t = passes.context_parallel_s(c, st, 0, own=False)
    assert own_t - other_t == pytest.approx(2 * (own - other) * st.micro_batches / s.micro_batches)


def test_pipelined_replicas_average_gradients_tensor_by_tensor():
    g, plan, c = _ctx(n=4, pp=2)
    s = passes.pass_shape(c, plan.units["train_actor"], True)
    assert s.dp == 2 and s.pp == 2
    per = passes.replica_tensor_sums_s(c, s, 0)
    assert per > WL.train_minibatches * 19 * 2 * c.cluster.collective_latency_s * 0.9
    sc = predict(g, plan, WL).stages["train_actor"]
    assert sc.detail["replica_tensor_sums_s"] > 0
    # a Megatron unit buckets them: no per-tensor term
    plan.units["train_actor"] = plan.units["train_actor"].model_copy(update={"engine": "megatron"})
    assert "replica_tensor_sums_s" not in predict(g, plan, WL).stages["train_actor"].detail
    # plain replicas (pp = cp = 1) sum in buckets
    _, plan1, c1 = _ctx(n=2)
    assert (
        passes.replica_tensor_sums_s(c1, passes.pass_shape(c1, plan1.units["train_actor"], True), 0)
        == 0
    )


def test_shared_cores_scale_the_collective_latency():
    _, _, c = _ctx(n=4, pp=2)
    half = unit_context(c, 2, 4)
    assert half.cluster.collective_latency_s == pytest.approx(2 * c.cluster.collective_latency_s)


def test_a_training_micro_batch_holds_at_most_one_optimizer_step():
    """On accelerators a rank whose mini-batch is smaller than a micro-batch's token budget
    still runs one micro-batch per mini-batch (its FSDP gathers and fixed costs)."""
    g = builders.build("grpo")
    plan = colocated_plan(g, "dgx-h100", num_devices=64, model="qwen2.5-7b")
    wl = Workload(
        num_prompts=64,
        samples_per_prompt=8,
        mean_prompt_tokens=200,
        max_response_tokens=16384,
        mean_response_tokens=1000,
        train_minibatches=4,
    )
    c = UnitContext(
        plan, wl, specs.cluster("dgx-h100", num_nodes=8), specs.model("qwen2.5-7b"), SHIPPED
    )
    u = plan.units["train_actor"].model_copy(update={"micro_batch_size": 4})
    s = passes.pass_shape(c, u, True)
    assert s.micro_batches == pytest.approx(wl.train_minibatches)
    assert s.tokens_mb * s.micro_batches == pytest.approx(s.tokens_rank)
    f = passes.pass_shape(c, u, False)  # a forward pass: one micro-batch
    assert f.micro_batches == pytest.approx(1.0)
