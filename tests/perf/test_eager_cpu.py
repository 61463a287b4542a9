"""RPEG's eager CPU runtime as the performance model prices it (rpeg.perf.eager_cpu): the
runtime's micro-batches (per optimizer step, by sample count), no activation recompute,
fp32 values on the wire, gloo collectives neither scaled by the fitted compute efficiency nor
hidden under the compute, and data-parallel replicas that each update all parameters. The
expected values are worked out by hand from the specs (rpeg-tiny, local-cpu)."""

from dataclasses import replace

import pytest

from rpeg import specs
from rpeg.compile.sources import resolve
from rpeg.perf import Workload, costs, eager_cpu
from rpeg.perf.calibration import SHIPPED
from rpeg.perf.pricing import predict
from rpeg.preflight import load_config

CPU = specs.cluster("local-cpu").gpu
H100 = specs.cluster("dgx-h100").gpu


def test_micro_batches_are_cut_per_optimizer_step_by_sample_count():
    # 128 samples over dp 2 in 4 optimizer steps: 16 rows a step; mbs 4 -> 4 a step, 16 in
    # all, of 4 rows x 9 tokens; mbs 64 -> one a step (4 in all) of 16 x 9 = 144 tokens
    assert eager_cpu.split(128, 9.0, 2, 4, 4) == eager_cpu.MicroBatches(16.0, 36.0)
    assert eager_cpu.split(128, 9.0, 2, 64, 4) == eager_cpu.MicroBatches(4.0, 144.0)
    # a forward pass (one "step"): 128 rows on one rank, mbs 64 -> 2 of 576 tokens
    assert eager_cpu.split(128, 9.0, 1, 64, 1) == eager_cpu.MicroBatches(2.0, 576.0)
    # 10 rows at mbs 4: ceil(2.5) = 3 micro-batches of 10/3 rows
    mb = eager_cpu.split(10, 9.0, 1, 4, 1)
    assert mb.count == 3.0 and mb.tokens == pytest.approx(30.0)


def test_collectives_are_not_scaled_on_cpu_and_not_hidden_under_compute():
    assert eager_cpu.scaled(CPU, 1.0, 0.2, 0.25) == pytest.approx(4.2)  # 1/0.25 + 0.2
    assert eager_cpu.scaled(H100, 1.0, 0.2, 0.25) == pytest.approx(4.8)  # 1.2/0.25
    comm: dict[str, float] = {"domain": 0.1}
    assert eager_cpu.overlap(CPU, 1.0, 0.4, comm, "domain") == 1.0
    assert comm == {"domain": pytest.approx(0.5)}
    gpu_comm: dict[str, float] = {}
    assert eager_cpu.overlap(H100, 1.0, 1.4, gpu_comm, "domain") == 1.4 and not gpu_comm
    assert eager_cpu.comm_value_bytes("fp32") == 4.0 and eager_cpu.comm_value_bytes("bf16") == 2.0


@pytest.fixture
def builtin():
    cfg = load_config("configs/builtin.yaml")
    g, plan = resolve(None, cfg)
    wl = replace(Workload.from_config(cfg.workload), mean_prompt_tokens=6.0)
    return g, plan, replace(wl, mean_response_tokens=3.0)


def test_data_parallel_gradients_go_over_gloo_in_fp32(builtin):
    """The built-in plan: train_actor on 2 CPU workers (dp 2, replicas), 4 optimizer steps,
    each all-reducing the fp32 gradients of rpeg-tiny's P parameters: a reduce-scatter and
    an all-gather of 4P bytes over 2 ranks, (1/2) 4P / (bw x eff) + alpha each."""
    g, plan, wl = builtin
    p = specs.model("rpeg-tiny").params
    link = specs.cluster("local-cpu").link("domain")
    one = 0.5 * 4.0 * p / (link.bytes_per_s * SHIPPED.nccl_bus_eff) + link.latency_s
    st = predict(g, plan, wl, calib=SHIPPED).stages["train_actor"]
    assert st.comm_s["domain"] == pytest.approx(4 * 2 * one)
    assert st.detail["micro_batches"] == 4.0  # 16 rows a step at mbs 64
    # the fitted scale applies to the work, not to the collectives or the dispatch
    fast = predict(g, plan, wl, calib=replace(SHIPPED, train_eff_scale=2.0))
    work = 2 * (st.time_s - fast.stages["train_actor"].time_s)
    assert st.time_s - work == pytest.approx(4 * 2 * one + st.detail["dispatch_s"])


def test_recompute_is_priced_on_cpu_where_the_runtime_checkpoints(builtin):
    """The runtime checkpoints decoder layers on CPU too (rpeg.runtime.unit_memory): a
    training micro-batch pays a fourth pass and keeps less activation memory; ``auto`` on the
    built-in model (activations far under a quarter of a worker's memory) is no recompute."""
    g, plan, wl = builtin
    u = plan.units["train_actor"]

    def at(setting):
        units = {**plan.units, "train_actor": u.model_copy(update={"recompute": setting})}
        return predict(g, plan.model_copy(update={"units": units}), wl, calib=SHIPPED)

    on, off, auto = (at(x).stages["train_actor"] for x in (True, False, "auto"))
    assert on.detail["recompute"] == 1.0 and off.detail["recompute"] == 0.0
    assert on.time_s > off.time_s
    assert on.memory_gb["activations"] < off.memory_gb["activations"]
    assert auto.time_s == pytest.approx(off.time_s)


def test_fsdp_gathers_add_to_the_pass_on_cpu(builtin):
    """The same plan with an FSDP trainer: per micro-batch an all-gather of the parameters
    and a reduce-scatter of the gradients (kept gathered from forward to backward: 2
    collectives), each moving the rank's half of 4P bytes, added to the collectives."""
    g, plan, wl = builtin
    u = plan.units["train_actor"]
    fsdp = plan.model_copy(
        update={"units": {**plan.units, "train_actor": u.model_copy(update={"engine": "fsdp"})}}
    )
    p = specs.model("rpeg-tiny").params
    link = specs.cluster("local-cpu").link("domain")
    eff = SHIPPED.nccl_bus_eff
    per_step = 2 * costs.gather_time(4.0 * p / 2, 2, link.bytes_per_s, link.latency_s, eff)
    per_micro = 2 * costs.gather_time(4.0 * p, 2, link.bytes_per_s, link.latency_s, eff)
    st = predict(g, fsdp, wl, calib=SHIPPED).stages["train_actor"]
    assert st.detail["fsdp_collectives_per_micro_batch"] == 2.0
    assert st.comm_s["domain"] == pytest.approx(4 * per_step + 4 * per_micro)


def test_a_replica_pair_on_one_host_prices_half_an_update_each(builtin):
    """The built-in plan's train_actor is two CPU replicas on one host: the runtime splits
    their update in halves (rpeg.runtime.pair_update), so each rank's AdamW moves 16 B of
    half the parameters per optimizer step: (P / 2) x 16 B x 2 (read + write) / memory
    bandwidth x 4 steps. The same unit at dp=1 updates all of them."""
    g, plan, wl = builtin
    p = specs.model("rpeg-tiny").params
    u = plan.units["train_actor"]
    st = predict(g, plan, wl, calib=SHIPPED).stages["train_actor"]
    assert (len(u.devices), u.tp, u.dp) == (2, 1, 0)  # dp 0: devices / (tp x pp) = 2
    assert st.detail["optimizer_s"] == pytest.approx(4 * (p / 2) * 16.0 * 2 / CPU.hbm_bytes_per_s)
    one = u.model_copy(update={"devices": u.devices[:1]})
    single = plan.model_copy(update={"units": {**plan.units, "train_actor": one}})
    st1 = predict(g, single, wl, calib=SHIPPED).stages["train_actor"]
    assert st1.detail["optimizer_s"] == pytest.approx(2 * st.detail["optimizer_s"])


def test_micro_batches_are_padded_to_their_longest_response():
    """The runtime pads every row of a micro-batch to its longest (RolloutBatch.select trims
    to that, nothing packs): 64 rows of 6 prompt + 3 response tokens on average, where a
    spread that puts ~2% of responses at the 16-token cap makes a step's forward on a rank
    compute 64 x (6 + 16) tokens, 22/9 of what the rows hold. A narrow spread pads little."""
    from types import SimpleNamespace

    from rpeg.perf.lengths import LengthDist

    def ctx(sigma):
        lengths = LengthDist(3.0, 16.0, sigma)
        assert lengths.p_cap * 64 > 0.5 or sigma < 0.5  # the wide one: some row at the cap
        return SimpleNamespace(
            N=128, P=6.0, R=3.0, wl=SimpleNamespace(train_minibatches=4), lengths=lengths
        )

    fwd = eager_cpu.micro_batches(ctx(1.2), 2, 64, False)
    assert fwd.count == 1.0 and fwd.tokens == pytest.approx(64 * 22.0)
    assert fwd.padding == pytest.approx(22.0 / 9.0)
    # an optimizer step's 16 rows: a shorter longest than 64 rows have, still above the mean
    train = eager_cpu.micro_batches(ctx(1.2), 2, 64, True)
    assert train.count == 4.0 and 1.0 < train.padding < fwd.padding
    assert eager_cpu.micro_batches(ctx(0.05), 2, 64, False).padding < 1.1


def _packing(plan, value, **more):
    update = {"seq_packing": value, **more}
    units = {n: u.model_copy(update=update) for n, u in plan.units.items()}
    return plan.model_copy(update={"units": units})


def test_padding_is_priced_where_micro_batches_are_padded_only(builtin):
    """The ref pass of the built-in plan, unpacked (seq_packing false), at a spread that pads
    it 22/9 computes that much more (up to the GEMM-size efficiency); so does a 7B model's on
    an H100 cluster at 8 rows of 1,000-token responses under a 16k cap a micro-batch. Packed
    (the default at pp 1),
    the same spread changes only the attention term."""
    g, plan, wl = builtin

    def ref(p, sigma, w=wl):
        return predict(g, p, replace(w, length_sigma=sigma), calib=SHIPPED).stages["ref_logprob"]

    from rpeg.perf.lengths import LengthDist
    from rpeg.plan import colocated_plan

    longest = LengthDist(3.0, 16.0, 0.05).expected_max(64)  # a little above the mean
    padded = _packing(plan, False)
    ratio = ref(padded, 1.2).detail["compute_s"] / ref(padded, 0.05).detail["compute_s"]
    assert ratio == pytest.approx((6 + 16) / (6 + longest), rel=0.1)
    gpu_plan = _packing(
        colocated_plan(g, "dgx-h100", num_devices=8, model="qwen2.5-7b"), "auto", micro_batch_size=8
    )
    long = replace(wl, mean_response_tokens=1000.0, max_response_tokens=16384)
    unpacked = _packing(gpu_plan, False)
    gw, gn = ref(unpacked, 1.2, long), ref(unpacked, 0.05, long)
    assert gw.detail["compute_s"] - gw.detail["attn_s"] > 1.5 * (
        gn.detail["compute_s"] - gn.detail["attn_s"]
    )
    for p, w in ((plan, wl), (gpu_plan, long)):
        assert all(u.packs() for u in p.units.values())
        pw, pn = ref(p, 1.2, w), ref(p, 0.05, w)
        assert pw.detail["compute_s"] - pw.detail["attn_s"] == pytest.approx(
            pn.detail["compute_s"] - pn.detail["attn_s"], rel=0.02
        )


def test_the_torch_engine_decodes_every_row_of_a_rank_to_the_longest_of_the_step(builtin):
    """On CPU workers the torch engine runs a rank's rows as one static batch, finished rows
    still computed, and the step waits for the rank holding the longest of all 128 rows: the
    decode scales with that longest, not with the rows still alive. An accelerator's auto
    engine is priced as continuous batching."""
    from rpeg.perf.lengths import LengthDist

    g, plan, wl = builtin

    def gen(p, sigma):
        w = replace(wl, length_sigma=sigma)
        return predict(g, p, w, calib=SHIPPED).stages["generate"]

    wide, narrow = gen(plan, 1.2), gen(plan, 0.05)
    assert wide.detail["static_batches"] == 1 and wide.detail["batch"] == 64  # 128 rows, dp 2
    assert wide.detail["longest_response"] == LengthDist(3.0, 16.0, 1.2).expected_max(128) == 16.0
    longest = LengthDist(3.0, 16.0, 0.05).expected_max(128)
    assert narrow.detail["longest_response"] == pytest.approx(longest)
    from rpeg.plan import colocated_plan

    gpu = gen(colocated_plan(g, "dgx-h100", num_devices=8, model="qwen2.5-7b"), 1.2)
    assert "static_batches" not in gpu.detail and "tail_s" in gpu.detail


def test_an_unpacked_unit_counts_its_own_micro_batches_per_optimizer_step(builtin):
    """The built-in plan's trainer unpacked at 4 rows a micro-batch: 128 rows over dp 2 in 4
    optimizer steps are 16 rows a step, 4 micro-batches each -- what the pipeline schedule and
    the fixed costs see -- though each computes more tokens than it holds (padded to its
    longest row: 16% more at this spread; counted by tokens they would be 3.4)."""
    from rpeg.perf.passes import pass_shape
    from rpeg.perf.units import UnitContext

    g, plan, wl = builtin
    u = plan.units["train_actor"].model_copy(update={"seq_packing": False, "micro_batch_size": 4})
    w = replace(wl, length_sigma=1.2)
    c = UnitContext(plan, w, specs.cluster("local-cpu"), specs.model("rpeg-tiny"), SHIPPED)
    s = pass_shape(c, u, True)
    assert s.padding > 1.1
    assert s.per_minibatch == 4.0 and s.micro_batches == 16.0
    packed = pass_shape(c, u.model_copy(update={"seq_packing": True}), True)
    assert packed.padding == 1.0 and packed.per_minibatch == 1.0  # 16 rows in 4 x 48 tokens
