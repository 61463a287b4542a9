"""Cells as people write them in the shared schema are read for what they say, or refused by
name -- never read as their leading digits ("16k" was 16 tokens, "8x2" 8 GPUs, "1m32s" one
second) and never refused for a common spelling ("bfloat16", "colocate", "~93", "GB200
NVL72")."""

import pytest

from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows
from rpeg.perf.validation.row_cells import Unpredictable, cell_number, gpu_name
from rpeg.perf.validation.rows import read_case


@pytest.mark.parametrize(
    ("column", "cell", "value"),
    [
        ("max_gen_len", "16k", 16384),  # a token cap: context sizes are powers of two
        ("max_seq_len", "4K", 4096),
        ("avg_gen_len", "1.2k", 1200),  # a mean: thousands
        ("avg_gen_len", "~1000", 1000),
        ("measured_step_s", "≈93", 93),
        ("measured_step_s", "1m32s", 92),
        ("measured_step_s", "1h 2m", 3720),
        ("measured_step_s", "92.8 s", 92.8),
        ("measured_step_s", "92.8s", 92.8),
        ("num_gpus", "8x2", 16),
        ("num_gpus", "16 (2 nodes)", 16),
        ("gpu_memory_utilization", "60%", 0.6),
        ("train_tp", "8 (inferred)", 8),
        ("max_gen_len", "27,648", 27648),  # thousands separators are not decimals
        ("num_gpus", "16-GPU", 16),  # annotations that name what is counted
        ("staleness", "1-step", 1),
        ("measured_step_s", "92.8*", 92.8),
        # a step time as a clock or in milliseconds; a word that qualifies it
        ("measured_step_s", "1:32", 92),
        ("measured_step_s", "1:02:05", 3725),
        ("measured_step_s", "95,000 ms", 95),
        ("measured_step_s", "95000ms", 95),
        ("measured_step_s", "95 avg", 95),
        ("measured_step_s", "95 s/step", 95),
        ("measured_step_s", "95±5", 95),
        # a recipe's key before the value
        ("samples_per_prompt", "n=8", 8),
        ("samples_per_prompt", "rollout.n: 16", 16),
        ("gen_tp", "tp = 4", 4),
    ],
)
def test_a_number_as_written(column, cell, value):
    assert cell_number({column: cell}, column) == pytest.approx(value)


@pytest.mark.parametrize(
    ("column", "cell"),
    [
        ("num_gpus", "16gb"),
        ("max_gen_len", "2M"),
        ("avg_gen_len", "1.5B"),
        # a unit after a space was dropped: "16 GB" read as 16, "2 nodes" as 2 GPUs
        ("num_gpus", "16 GB"),
        ("num_gpus", "2 nodes"),
        # a ratio or a range is not one number: "1:32" read as 1, "8-16" as 8
        ("num_gpus", "1:32"),
        ("num_gpus", "8-16"),
        ("num_prompts", "64/128"),
        ("measured_step_s", "95 - 100"),
    ],
)
def test_a_unit_it_does_not_know_is_named_not_dropped(column, cell):
    with pytest.raises(Unpredictable, match=f"{column}='{cell}' is not a number"):
        cell_number({column: cell}, column)


@pytest.mark.parametrize(
    ("written", "catalog"),
    [
        ("GB200 NVL72", "gb200"),
        ("B200 HGX", "b200"),
        ("DGX H100", "h100-sxm"),
        ("H100 NVL", "h100-nvl"),
        ("H200 NVL", "h200-nvl"),  # a PCIe card of its own, not the SXM H200
        ("MI300X OAM", "mi300x"),
        ("Hopper H100", "h100-sxm"),
    ],
)
def test_the_system_a_gpu_sits_in_is_not_its_name(written, catalog):
    assert gpu_name({"gpu": written}) == catalog


@pytest.mark.parametrize(
    ("written", "catalog", "tflops"),
    [
        ("RTX A6000", "rtx-a6000", 154.8),
        ("A6000 48GB", "rtx-a6000", 154.8),
        ("A40", "a40", 149.7),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada", 364.2),
        # Huawei's NPU (verl / MindSpeed-RL runs): verl's own MFU basis, 354 TF
        ("Ascend 910B", "ascend-910b", 354),
        ("Huawei Ascend 910B3", "ascend-910b", 354),
        ("Atlas 800T A2", "ascend-910b", 354),
        ("RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000", 503.8),
        ("H200 NVL", "h200-nvl", 835),
    ],
)
def test_workstation_cards_of_academic_rl_runs_are_priced(written, catalog, tflops):
    from rpeg import specs
    from rpeg.perf.validation.row_cells import cluster_for

    assert gpu_name({"gpu": written}) == catalog
    assert specs.gpu(catalog).bf16_dense_tflops == tflops  # dense: half the sparse figure
    c = specs.cluster(cluster_for(catalog, 4))
    assert (c.gpu.name, c.gpus_per_node) == (catalog, 4)  # a row's node size, links kept


@pytest.mark.parametrize(
    ("written", "catalog", "hbm_gb"),
    [
        # a dual-die 910C is listed as two NPUs: one catalog device is one die
        ("Atlas A3", "ascend-910c", 64),
        ("Ascend 910C", "ascend-910c", 64),
        ("16x Atlas 800T A3", "ascend-910c", 64),
        ("Atlas 900 A3 SuperPoD", "ascend-910c", 64),
        # the H20's 141 GB SKU by its size or its nickname; a bare H20 is the 96 GB part
        ("NVIDIA H20 141GB HBM3e", "h20-141g", 141),
        ("H20-3e", "h20-141g", 141),
        ("H20", "h20", 96),
        ("H20 96GB", "h20", 96),
        # the 4090's China SKU (fewer SMs), the H800 PCIe (an H100 PCIe), Ada's RTX 6000
        ("NVIDIA GeForce RTX 4090 D", "rtx-4090d", 24),
        ("RTX 4090D", "rtx-4090d", 24),
        ("H800 PCIe", "h100-pcie", 80),
        ("A6000 Ada", "rtx-6000-ada", 48),
    ],
)
def test_newer_chinese_parts_are_their_own_entries(written, catalog, hbm_gb):
    from rpeg import specs
    from rpeg.perf.validation.row_cells import cluster_for

    assert gpu_name({"gpu": written}) == catalog
    assert specs.gpu(catalog).hbm_gb == hbm_gb
    assert specs.cluster(cluster_for(catalog, None)).gpu.name == catalog
    if catalog == "rtx-4090d":  # 114 of the 4090's 128 SMs
        assert specs.gpu(catalog).bf16_dense_tflops < specs.gpu("rtx-4090").bf16_dense_tflops


def test_an_atlas_a3_superpod_joins_its_nodes_on_the_unified_bus():
    from rpeg import specs

    c = specs.cluster("atlas-a3-superpod")
    assert c.gpus_per_node == 16  # 8 chips x 2 dies a server
    assert c.domain_size > c.gpus_per_node  # the UB spans servers: not a NIC hop
    a100 = specs.cluster("dgx-a100")
    assert a100.domain_size == a100.gpus_per_node


def _row(**cells):
    for r in read_rows(loso.default_datasets()["steps_dev"]):
        if r["case_id"] == "nemo-v0.5-h100bf16-llama-grpo-on-16g":
            return {**r, **cells}
    raise KeyError


@pytest.mark.parametrize(
    ("cells", "same_as"),
    [
        (dict(placement="colocate"), dict(placement="colocated")),
        (dict(placement="Co-located"), dict(placement="colocated")),
        (dict(placement="colocated (sync)"), dict(placement="colocated")),
        (dict(placement="Hybrid Engine"), dict(placement="colocated")),
        (dict(placement="co_located"), dict(placement="colocated")),
        *(
            (
                dict(placement=p, gen_gpus="8", train_gpus="8"),
                dict(placement="disaggregated", gen_gpus="8", train_gpus="8"),
            )
            for p in ("separate pools", "Disaggregated; 8:8", "decoupled")
        ),
        (dict(precision="bfloat16"), dict(precision="bf16")),
        (dict(precision="BF16/FP32"), dict(precision="bf16")),  # compute / master
        (dict(precision="fp16 (fp32 grads/optimizer)"), dict(precision="fp16")),
        (dict(precision="tf32"), dict(precision="fp32")),
        (dict(staleness="one-step"), dict(staleness="1")),
        (dict(staleness="off-policy 2"), dict(staleness="2")),
        (dict(staleness="on-policy"), dict(staleness="0")),
        (dict(partial_rollout="yes (interruptible)"), dict(partial_rollout="yes")),
        (dict(partial_rollout="interruptible"), dict(partial_rollout="yes")),
        (dict(partial_rollout="No - sync"), dict(partial_rollout="no")),
        (dict(precision="float16"), dict(precision="fp16")),
        (dict(max_gen_len="4k"), dict(max_gen_len="4096")),
    ],
)
def test_a_spelling_reads_as_the_canonical_cell(cells, same_as):
    a, b = read_case(_row(**cells)), read_case(_row(**same_as))
    assert (a.colocated, a.staleness, a.partial, a.workload) == (
        b.colocated,
        b.staleness,
        b.partial,
        b.workload,
    )


def test_a_lag_that_states_no_bound_is_refused_naming_the_allowed_values():
    with pytest.raises(Unpredictable, match=r"staleness='async' states no bound; allowed: .*inf"):
        read_case(_row(staleness="async"))
    with pytest.raises(Unpredictable, match="partial_rollout='maybe'; allowed: yes, no"):
        read_case(_row(partial_rollout="maybe"))


def test_an_ambiguous_placement_is_still_refused_by_name():
    with pytest.raises(
        Unpredictable, match="placement='hybrid'; allowed: colocated, disaggregated"
    ):
        read_case(_row(placement="hybrid"))
