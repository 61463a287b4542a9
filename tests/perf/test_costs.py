"""Cost formulas against hand-worked numbers."""

import pytest

from rpeg import specs
from rpeg.perf import costs
from rpeg.perf.calibration import DEFAULT
from rpeg.perf.lengths import LengthDist


def test_ring_allreduce_hand_numbers():
    # 1 GB over 8 ranks at 100 GB/s, no latency: 2 * 7/8 * 1e9 / 1e11 = 17.5 ms
    assert costs.allreduce_time(1e9, 8, 100e9, 0.0, 1.0) == pytest.approx(0.0175)
    # latency term: 2 * log2(8) * 10 us = 60 us
    assert costs.allreduce_time(0.0, 8, 100e9, 1e-5, 1.0) == 0.0
    assert costs.allreduce_time(1.0, 8, 1e30, 1e-5, 1.0) == pytest.approx(6e-5)
    assert costs.allreduce_time(1e9, 1, 100e9, 1e-5, 1.0) == 0.0


def test_kv_cache_bytes_llama_8b():
    m = specs.model("llama3.1-8b")
    # 2 (K,V) * 32 layers * 8 kv heads * 128 dims * 2 bytes = 131072 B per token
    assert costs.kv_cache_bytes(m, 1000, tp=1) == 131072 * 1000
    assert costs.kv_cache_bytes(m, 1000, tp=2) == 131072 * 1000 / 2
    assert costs.kv_cache_bytes(m, 1000, tp=16) == 131072 * 1000 / 8  # only 8 kv heads to split


def test_decode_step_is_weight_bandwidth_bound_at_batch_1():
    m = specs.model("llama3.1-8b")
    cl = specs.cluster("dgx-h100")
    t, flops, nbytes, comm = costs.decode_step_time(
        m,
        cl.gpu,
        cl,
        batch=1,
        context=0,
        tp=1,
        pp=1,
        first_device=0,
        wbytes=2.0,
        kvbytes=2.0,
        calib=DEFAULT,
        precision="bf16",
    )
    expected = (
        m.params * 2 / (3.35e12 * DEFAULT.decode_hbm_eff)
        + DEFAULT.decode_step_overhead_s
        + 1 * DEFAULT.decode_seq_overhead_s  # one live sequence
    )
    assert nbytes == m.params * 2
    assert comm == 0.0
    assert t == pytest.approx(expected, rel=1e-9)  # ~6.4 ms + 4 ms
    assert 0.010 < t < 0.011


def test_decode_grows_with_live_kv():
    m = specs.model("llama3.1-8b")
    cl = specs.cluster("dgx-h100")
    kw = dict(tp=1, pp=1, first_device=0, wbytes=2.0, kvbytes=2.0, calib=DEFAULT, precision="bf16")
    t0 = costs.decode_step_time(m, cl.gpu, cl, batch=256, context=0, **kw)[0]
    t1 = costs.decode_step_time(m, cl.gpu, cl, batch=256, context=2000, **kw)[0]
    kv = 256 * 2000 * 131072
    assert t1 - t0 == pytest.approx(kv / (3.35e12 * DEFAULT.decode_hbm_eff), rel=0.05)


def test_a_pipelined_decode_reads_every_stage_per_token():
    # one sequence through pp stages waits on each in turn: its token reads the whole model's
    # weights (over tp), plus one step overhead per stage; a pipeline does not make a lone
    # sequence's token pp times cheaper
    m = specs.model("llama3.1-8b")
    cl = specs.cluster("dgx-h100")
    kw = dict(first_device=0, wbytes=2.0, kvbytes=2.0, calib=DEFAULT, precision="bf16")
    one = costs.decode_step_time(m, cl.gpu, cl, batch=1, context=0, tp=1, pp=1, **kw)
    two = costs.decode_step_time(m, cl.gpu, cl, batch=1, context=0, tp=1, pp=2, **kw)
    weights = m.params * 2 / (3.35e12 * DEFAULT.decode_hbm_eff)
    overhead = DEFAULT.decode_step_overhead_s + DEFAULT.decode_seq_overhead_s
    assert one[0] == pytest.approx(weights + overhead, rel=1e-9)
    assert two[0] == pytest.approx(weights + 2 * overhead, rel=1e-9)
    assert two[2] == pytest.approx(one[2])  # a device reads its stage per micro-batch
    # a full batch splits into pp micro-batches: the same bytes and flops per token step
    big = dict(batch=256, context=2000, **kw)
    b1 = costs.decode_step_time(m, cl.gpu, cl, tp=1, pp=1, **big)
    b2 = costs.decode_step_time(m, cl.gpu, cl, tp=1, pp=2, **big)
    assert b2[1] == pytest.approx(b1[1] / 2)  # a device computes its half of the layers
    kv = 256 * 2000 * 131072
    assert b2[2] == pytest.approx(m.params * 2 + kv / 2, rel=1e-3)


def test_training_flops_6n_plus_attention():
    m = specs.model("rpeg-tiny")
    tokens, seq = 1000.0, 100.0  # 10 sequences of 100 tokens
    sq = 10 * seq * seq
    attn = m.layers * (m.attn_width + m.v_width) * sq  # causal: L * (d_qk + d_v) * s^2
    assert costs.forward_flops(m, tokens, sq) == pytest.approx(2 * m.matmul_params * tokens + attn)
    assert costs.train_flops(m, tokens, sq, recompute=False) == pytest.approx(
        3 * (2 * m.matmul_params * tokens + attn)
    )
    assert costs.train_flops(m, tokens, sq, recompute=True) == pytest.approx(
        4 * (2 * m.matmul_params * tokens + attn)
    )
    # tied embeddings: the table is the LM head, counted once
    assert m.matmul_params == m.params


def test_moe_weights_read_saturate_with_batch():
    m = specs.model("qwen3-30b-a3b")
    small = costs.weight_bytes_read(m, 1, 2.0)
    big = costs.weight_bytes_read(m, 4096, 2.0)
    assert small < 0.2 * big
    assert big == pytest.approx(m.params * 2.0, rel=1e-3)


def test_length_distribution_mean_and_tail():
    d = LengthDist(1000, 4096, 0.8)
    # the clamped mean is recovered by integrating the survival function
    steps = 4096
    mean = sum(d.survival(t + 0.5) for t in range(steps))
    assert mean == pytest.approx(1000, rel=0.01)
    assert d.expected_max(2048) == 4096  # some of 2048 responses hit the cap
    assert d.expected_max(4) < 4096
    assert d.second_moment() > 1000**2


def test_alltoall_straddling_a_rack_is_bound_by_the_minority_side():
    cl = specs.cluster("gb200-nvl72", num_nodes=32)  # 128 GPUs = NVL72 racks 0-71, 72-143
    nic = cl.link("rack").bytes_per_s  # 4 x 50 GB/s per 4-GPU tray = 50 GB/s per GPU
    nvl = cl.link("domain").bytes_per_s  # 900 GB/s
    n = 1e9
    # aligned: 16 ranks stride 4 from GPU 0 all inside rack 0 -> 15/16 over NVLink
    t, lvl = costs.alltoall_time(n, 16, cl, 0, 4, 1.0)
    assert lvl == "domain"
    assert t == pytest.approx(n * 15 / 16 / nvl + 15 * cl.link("domain").latency_s / 2)
    # straddling: ranks 64, 68 in rack 0 and 72..124 in rack 1: the two in rack 0 send
    # 14/16 of their bytes over their NIC -> 1e9 * 14/16 / 50e9 = 17.5 ms (+ latency)
    t, lvl = costs.alltoall_time(n, 16, cl, 64, 4, 1.0)
    assert lvl == "cluster"  # an NVL72 rack is one domain: crossing it leaves the rack
    nic = cl.link("cluster").bytes_per_s  # no oversubscription: = the NIC rate
    assert t == pytest.approx(n * 14 / 16 / nic + 15 * cl.link("cluster").latency_s / 2)


def test_flash_attention_backward_ratio():
    # train, no recompute: fwd 1 + bwd 2.5 = 3.5 forward-equivalents; with recompute 4.5;
    # forward-only passes unchanged
    assert costs.attn_passes(3.0, True, DEFAULT) == pytest.approx(3.5)
    assert costs.attn_passes(4.0, True, DEFAULT) == pytest.approx(4.5)
    assert costs.attn_passes(1.0, False, DEFAULT) == 1.0


def test_cpu_layer_overhead_is_a_device_field():
    cpu, h100 = specs.gpus()["cpu"], specs.gpus()["h100-sxm"]
    import importlib.resources

    import yaml

    raw = yaml.safe_load(
        importlib.resources.files("rpeg.specs").joinpath("data/gpus.yaml").read_text()
    )
    ms = raw["gpus"]["cpu"]["layer_overhead_ms"]  # measured, in ms in the data file
    assert ms > 0 and cpu.layer_overhead_s == pytest.approx(ms / 1e3)  # seconds in the spec
    assert h100.layer_overhead_s == 0.0  # GPUs use Calibration.layer_overhead_s


def test_an_eager_decode_step_is_bound_by_the_hosts_layer_launches():
    # without CUDA graphs the host launches every layer's kernels each step: a small model's
    # lone sequence waits on them (layers x the per-layer launch cost), a large batch whose
    # device time exceeds that does not
    m = specs.model("qwen2.5-0.5b-instruct")
    cl = specs.cluster("dgx-h100")
    kw = dict(tp=1, pp=1, first_device=0, wbytes=2.0, kvbytes=2.0, calib=DEFAULT, precision="bf16")
    graphs = costs.decode_step_time(m, cl.gpu, cl, batch=1, context=0, **kw)[0]
    eager = costs.decode_step_time(m, cl.gpu, cl, batch=1, context=0, eager=True, **kw)[0]
    overhead = DEFAULT.decode_step_overhead_s + DEFAULT.decode_seq_overhead_s
    weights = m.params * 2 / (3.35e12 * DEFAULT.decode_hbm_eff)  # ~0.3 ms
    assert graphs == pytest.approx(weights + overhead, rel=1e-9)
    assert eager == pytest.approx(m.layers * DEFAULT.layer_overhead_s + overhead, rel=1e-9)
    big = dict(batch=256, context=30000, **kw)  # ~40 ms of KV reads a step
    assert costs.decode_step_time(m, cl.gpu, cl, eager=True, **big)[0] == pytest.approx(
        costs.decode_step_time(m, cl.gpu, cl, **big)[0]
    )
    # a pipeline stage launches its own layers
    two = costs.decode_step_time(
        m,
        cl.gpu,
        cl,
        batch=1,
        context=0,
        tp=1,
        pp=2,
        eager=True,
        **{k: v for k, v in kw.items() if k not in ("tp", "pp")},
    )[0]
    assert two == pytest.approx(2 * (m.layers / 2 * DEFAULT.layer_overhead_s + overhead), rel=1e-9)
