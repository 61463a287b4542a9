"""`rpeg specs add-model --from-hf config.json` puts a model into the user catalog; rows that
name it are then predicted."""

import json

import pytest

from rpeg import specs
from rpeg.cli import main
from rpeg.perf.validation.published import read_rows, validate_rows
from rpeg.specs import SpecError
from rpeg.specs.hf import add_model, entry_from_hf

# Qwen2.5-7B-Instruct's config.json fields (the public file), written out here.
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_hf_config_maps_to_the_catalog_fields():
    e = entry_from_hf(QWEN25_7B)
    assert e["head_dim"] == 128 and e["qkv_bias"] is True and e["kv_heads"] == 4
    cat = specs.model("qwen2.5-7b-instruct")
    from rpeg.specs.models import parse_models

    m = parse_models([({"models": {"x": e}}, "test")])["x"]
    assert m.params == cat.params  # same architecture, same derived count
    assert m.params / 1e9 == pytest.approx(7.62, rel=0.015)  # published 7.62 B


def test_add_model_cli_then_rows_naming_it_are_predicted(tmp_path, capsys):
    cfg = tmp_path / "my-qwen" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(QWEN25_7B))
    try:
        assert main(["specs", "add-model", "--from-hf", str(cfg), "--kind", "base"]) == 0
        out = capsys.readouterr().out
        assert "my-qwen" in out and "B params" in out
        assert specs.model("my-qwen").kind == "base"
        row = dict(next(r for r in read_rows() if r["model"] == "qwen2.5-math-7b"))
        (res,) = validate_rows([dict(row, model="my-qwen")]).rows
        assert res.prediction is not None, res.reason
    finally:
        (specs.user_specs_dir() / "models.yaml").unlink(missing_ok=True)
        specs.reload()


def test_unreadable_or_unknown_configs_list_every_problem(tmp_path):
    bad = dict(QWEN25_7B, model_type="mamba")
    del bad["hidden_size"]
    with pytest.raises(SpecError) as ei:
        entry_from_hf(bad, kind="chatty")
    text = str(ei.value)
    assert "model_type" in text and "hidden_size" in text and "kind" in text
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(SpecError, match="not a readable JSON file"):
        add_model(p, "x", out=tmp_path / "models.yaml")
