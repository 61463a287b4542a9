"""Accelerators of unseen publications' RL runs (added 2026-12-06): older NVIDIA clusters
(V100 DGX-1/DGX-2, PCIe V100), cloud instances (A10G / AWS g5, L4, T4, A10, A30), AMD CDNA2
(MI250X / MI250, one catalog GPU per GCD) and consumer cards (RTX 3090 / 5090). The names
papers and nvidia-smi print resolve onto them, their peaks are the datasheets' dense figures
(the expected numbers below are the vendors', not read back from the catalog), each has a
cluster, and a published row on each is priced."""

import pytest

from rpeg import specs
from rpeg.perf.validation import loso
from rpeg.perf.validation.row_cells import cluster_for, gpu_name, unknown_names

WRITTEN = {
    "V100": "v100-32g",  # a bare V100: the SXM2 32 GB part of DGX-1V / DGX-2 training runs
    "Tesla V100-SXM2-32GB": "v100-32g",
    "V100-32GB": "v100-32g",
    "V100-SXM3-32GB": "v100-32g",  # DGX-2's board
    "V100 16GB": "v100-16g",
    "Tesla V100-SXM2-16GB": "v100-16g",
    "V100-PCIE-32GB": "v100-pcie",
    "Tesla V100-PCIE-16GB": "v100-pcie-16g",
    "V100S-PCIE-32GB": "v100s",
    "A10G": "a10g",
    "NVIDIA A10G": "a10g",
    "NVIDIA A10": "a10",
    "A10": "a10",
    "A30": "a30",
    "NVIDIA A30 24GB": "a30",
    "L4": "l4",
    "NVIDIA L4": "l4",
    "T4": "t4",
    "Tesla T4": "t4",
    "MI250X": "mi250x",
    "AMD Instinct MI250X": "mi250x",
    "MI250": "mi250",
    "AMD Instinct MI250": "mi250",
    "RTX 3090": "rtx-3090",
    "GeForce RTX 3090": "rtx-3090",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
    "RTX 5090": "rtx-5090",
    "NVIDIA GeForce RTX 5090": "rtx-5090",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40g",  # was the 80 GB a100-pcie before
    "A800-PCIE-80GB": "a100-pcie",  # the A100 PCIe 80GB with capped links
}


@pytest.mark.parametrize("written", sorted(WRITTEN))
def test_written_names_resolve(written):
    assert gpu_name({"gpu": written}) == WRITTEN[written]
    assert not unknown_names({"model": "Qwen2.5-7B-Instruct", "gpu": written})


# datasheet figures: dense BF16 (FP16 where the part has no BF16) TFLOP/s, memory GB, TB/s
DATASHEET = {
    "v100-32g": (125, 32, 0.9),
    "v100-16g": (125, 16, 0.9),
    "v100-pcie": (112, 32, 0.9),
    "v100-pcie-16g": (112, 16, 0.9),
    "v100s": (130, 32, 1.134),
    "a10": (125, 24, 0.6),
    "a10g": (70, 24, 0.6),
    "a30": (165, 24, 0.933),
    "l4": (121, 24, 0.3),
    "t4": (65, 16, 0.32),
    "mi250x": (383 / 2, 128 / 2, 3.2768 / 2),  # per GCD: half the OAM package
    "mi250": (362.1 / 2, 128 / 2, 3.2768 / 2),
    "rtx-3090": (71.2, 24, 0.936),  # FP32 accumulate: half the GeForce FP16-accumulate 142
    "rtx-5090": (838.4 / 4, 32, 1.792),  # sparse FP16-acc 838.4 -> dense -> FP32 acc
    "a100-pcie-40g": (312, 40, 1.555),
}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_peaks_are_the_datasheets_dense_figures(name):
    g = specs.gpu(name)
    tflops, gb, tbps = DATASHEET[name]
    assert g.bf16_dense_tflops == pytest.approx(tflops, rel=0.005)
    assert g.hbm_gb == pytest.approx(gb)
    assert g.hbm_tbps == pytest.approx(tbps, rel=0.005)
    # device memory the driver reports is never below the marketing figure by much
    assert g.usable_hbm_gb >= 0.99 * gb


def test_parts_without_bf16_price_fp16_and_bf16_at_the_fp16_tensor_rate():
    for name in ("v100-32g", "v100-16g", "v100-pcie", "t4"):
        g = specs.gpu(name)
        assert g.fp8_dense_tflops is None
        assert g.peak_flops("fp16") == g.peak_flops("bf16") == g.bf16_dense_tflops * 1e12
    # Ampere and CDNA2 have no FP8; Ada and Blackwell have it at twice the BF16 rate
    for name in ("a10", "a10g", "a30", "rtx-3090", "mi250x", "mi250"):
        assert specs.gpu(name).fp8_dense_tflops is None
    assert specs.gpu("l4").fp8_dense_tflops == pytest.approx(485 / 2)
    assert specs.gpu("rtx-5090").fp8_dense_tflops == pytest.approx(2 * 209.5)


@pytest.mark.parametrize(
    ("gpu", "default", "per_node"),
    [
        ("v100-32g", "dgx1-v100", 8),
        ("v100-16g", "dgx1-v100-16g", 8),
        ("v100-pcie", "v100-pcie-cluster", 8),
        ("v100-pcie-16g", "v100-pcie-16g-cluster", 8),
        ("v100s", "v100s-cluster", 8),
        ("a10", "a10-cluster", 8),
        ("a10g", "aws-g5", 8),
        ("a30", "a30-cluster", 4),
        ("l4", "l4-cluster", 8),
        ("t4", "t4-cluster", 8),
        ("mi250x", "frontier-mi250x", 8),
        ("mi250", "mi250-cluster", 8),
        ("rtx-3090", "rtx3090-cluster", 8),
        ("rtx-5090", "rtx5090-cluster", 8),
        ("a100-pcie-40g", "a100-pcie-40g-cluster", 8),
    ],
)
def test_each_new_gpu_has_its_cluster(gpu, default, per_node):
    assert cluster_for(gpu, None) == default
    c = specs.cluster(default)
    assert c.gpu.name == gpu and c.gpus_per_node == per_node
    assert cluster_for(gpu, per_node) == default
    other = 4 if per_node == 8 else 8  # the other common node size, derived from the default
    derived = specs.cluster(cluster_for(gpu, other))
    assert derived.gpu.name == gpu and derived.gpus_per_node == other


def test_node_fabrics():
    # NVLink2: 6 links x 25 GB/s per direction; DGX-2 joins 16 GPUs over NVSwitch
    assert specs.cluster("dgx1-v100").intra_gbps == 150
    assert cluster_for("v100-32g", 16) == "dgx2-v100"
    dgx2 = specs.cluster("dgx2-v100")
    assert (dgx2.fabric, dgx2.intra_gbps) == ("nvswitch", 150)
    # PCIe cards: Gen3 x16 ~16 GB/s (V100 PCIe, T4), Gen4 x16 32 GB/s (A10/A10G/A30/L4)
    assert specs.cluster("t4-cluster").intra_gbps == 16
    for name in ("a10-cluster", "aws-g5", "a30-cluster", "l4-cluster"):
        c = specs.cluster(name)
        assert (c.fabric, c.intra_gbps) == ("none", 32)
    # Frontier / LUMI: 4 MI250X packages = 8 GCDs over Infinity Fabric, one Slingshot-11
    # 200 Gb/s NIC per package
    fr = specs.cluster("frontier-mi250x")
    assert (fr.fabric, fr.gpus_per_node, fr.nics_per_node, fr.gbps_per_nic) == (
        "infinity-fabric",
        8,
        4,
        25,
    )
    assert fr.link("rack").bytes_per_s == pytest.approx(4 * 25e9 / 8)


ROW = {
    "source": "user",
    "algorithm": "ppo",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "num_gpus": "8",
    "gpus_per_node": "8",
    "num_prompts": "32",
    "samples_per_prompt": "4",
    "max_gen_len": "1024",
    "avg_prompt_len": "256",
    "precision": "fp16",
    "measured_step_s": "120",
}


def test_a_7b_row_on_each_new_gpu_is_predicted():
    written = ["V100", "V100 16GB", "V100-PCIE-32GB", "Tesla V100-PCIE-16GB", "V100S-PCIE-32GB"]
    written += ["A10", "A10G", "A30", "L4", "T4", "MI250X", "MI250", "RTX 3090", "RTX 5090"]
    written += ["NVIDIA A100-PCIE-40GB"]
    rows = [{**ROW, "case_id": w, "gpu": w} for w in written]
    rows.append({**ROW, "case_id": "a30-4", "gpu": "A30", "gpus_per_node": "4"})
    rows.append({**ROW, "case_id": "bf16-v100", "gpu": "V100", "precision": "bf16"})
    priced, refused = loso.price_rows(rows, "mine")
    assert not refused, [(r.case_id, r.reason) for r in refused]
    step = {p.case_id: float(p.step.mean()) for p in priced}
    assert set(step) == {r["case_id"] for r in rows}
    assert all(s > 0 for s in step.values())
    # the slow parts are slower: a T4 (65 TF, 320 GB/s) behind an A100 PCIe 40GB, the A10G
    # (70 TF tensor) behind the A10 (125 TF) on the same memory
    assert step["T4"] > step["NVIDIA A100-PCIE-40GB"]
    assert step["A10G"] > step["A10"]
    # a bf16 row on a V100 is priced at the FP16 rate: as the fp16 row
    assert step["bf16-v100"] == pytest.approx(step["V100"], rel=0.05)
