"""Catalogs: shipped files validate, parameter counts derive from the architecture,
every problem in a bad file is reported at once, user files override."""

import pytest

from rpeg import specs
from rpeg.specs import SpecError
from rpeg.specs.clusters import parse_clusters
from rpeg.specs.gpus import parse_gpus
from rpeg.specs.models import parse_models


def test_shipped_catalogs_load_and_cover_the_required_entries():
    g, c, m = specs.gpus(), specs.clusters(), specs.models()
    for name in (
        "h100-sxm",
        "h200",
        "gh200",
        "gh200-144g",
        "gb200",
        "a100-80g",
        "h20",
        "h800",
        "mi300x",
        "cpu",
    ):
        assert name in g
    for name in ("dgx-h100", "h800-cluster", "gh200-alps", "local-cpu"):
        assert name in c
    for name in (
        "llama3.1-8b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
        "rpeg-tiny",
        "qwen2.5-math-7b",
    ):
        assert name in m


@pytest.mark.parametrize(
    "name", [n for n, m in specs.models().items() if m.published_params_b and not m.unsupported]
)
def test_derived_parameter_counts_match_published(name):
    m = specs.model(name)
    assert m.params / 1e9 == pytest.approx(m.published_params_b, rel=0.015)
    if m.published_active_params_b:
        assert m.active_params / 1e9 == pytest.approx(m.published_active_params_b, rel=0.03)


def test_llama_8b_by_hand():
    m = specs.model("llama3.1-8b")
    attn = 4096 * 4096 * 2 + 2 * 4096 * 1024
    mlp = 3 * 4096 * 14336
    emb = 2 * 128256 * 4096
    assert m.params == emb + 32 * (attn + mlp + 2 * 4096) + 4096
    assert m.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2  # 131072 B


def test_mla_kv_cache_is_the_latent():
    m = specs.model("deepseek-v3")
    assert m.kv_bytes_per_token(2) == 61 * (512 + 64) * 2


def test_bad_gpu_file_lists_every_problem():
    bad = {
        "defaults": {"efficiency": {"matmul": [[6, 0.1], [8, 0.5]], "hbm": [[5, 0.1], [8, 0.9]]}},
        "gpus": {
            "x": {"bf16_dense_tflops": -1, "hbm_gb": "lots", "hbm_tbps": 3, "colour": "red"},
            "y": {
                "bf16_dense_tflops": 100,
                "hbm_gb": 80,
                "hbm_tbps": 2,
                "efficiency": {"matmul": [[8, 0.5], [6, 1.5]]},
            },
        },
    }
    with pytest.raises(SpecError) as info:
        parse_gpus([(bad, "test.yaml")])
    where = " ".join(p.where for p in info.value.problems)
    text = str(info.value)
    assert (
        "gpus.x.bf16_dense_tflops" in where
        and "gpus.x.hbm_gb" in where
        and "gpus.x.colour" in where
    )
    assert "x values must increase" in text and "out of range" in text


def test_bad_cluster_and_model_entries():
    with pytest.raises(SpecError) as info:
        parse_clusters(
            [({"clusters": {"c": {"gpu": "nope", "gpus_per_node": 0}}}, "rpeg/x.yaml")],
            specs.gpus(),
        )
    assert "unknown GPU 'nope'" in str(info.value)
    assert any(p.where.endswith("intra_node") for p in info.value.problems)
    with pytest.raises(SpecError) as info:
        parse_models(
            [
                (
                    {"models": {"m": {"layers": 2, "hidden": 64, "heads": 6, "kv_heads": 4}}},
                    "rpeg/m.yaml",
                )
            ]
        )
    wheres = {p.where.split(": ")[-1] for p in info.value.problems}
    assert {
        "models.m.ffn_hidden",
        "models.m.head_dim",
        "models.m.vocab",
        "models.m.kv_heads",
    } <= wheres


def test_unknown_name_lists_known():
    with pytest.raises(SpecError, match="known: .*llama3.1-8b"):
        specs.model("gpt-5")


def test_user_file_overrides_cpu(tmp_path, monkeypatch):
    (tmp_path / "gpus.yaml").write_text(
        "gpus:\n  cpu: {bf16_dense_tflops: 0.123, hbm_gb: 4, hbm_tbps: 0.02, calibrated: true}\n"
    )
    monkeypatch.setenv("RPEG_SPECS_DIR", str(tmp_path))
    specs.reload()
    try:
        assert specs.gpu("cpu").bf16_dense_tflops == 0.123 and specs.gpu("cpu").calibrated
        assert specs.gpu("h100-sxm").hbm_gb == 80
    finally:
        monkeypatch.delenv("RPEG_SPECS_DIR")
        specs.reload()


def test_cluster_sizing_and_levels():
    c = specs.cluster("dgx-h100", num_nodes=32)
    assert c.num_devices == 256
    assert c.locate(17) == (0, 2, 1)
    assert c.span_level(range(0, 8)) == "domain"
    assert c.span_level(range(0, 16)) == "rack"
    assert c.span_level(range(0, 64)) == "cluster"
    nvl = specs.cluster("gb200-nvl72")
    assert nvl.span_level(range(0, 64)) == "domain"
    assert c.link("rack").bytes_per_s == pytest.approx(50e9)


def test_every_catalog_gpu_has_a_cluster_for_validation_rows():
    from rpeg.perf.validation.row_cells import cluster_for

    clusters = specs.clusters()
    for gpu in specs.gpus():
        name = cluster_for(gpu, None)
        assert clusters[name].gpu.name == gpu
