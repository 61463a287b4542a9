"""Planning prices the user's model (issue 29, item 9): with ``model.path`` set and
``model.name`` left at its default, ``rpeg plan`` and the run's prediction (``rpeg train``'s
timeouts, memory messages and plan report) read the folder's config.json; a folder that
cannot be read is refused naming how to add the model. Never the built-in tiny model."""

from __future__ import annotations

import json

import pytest
import yaml

from rpeg.cli import main

# The tiny Qwen2 of tests/firstday/tiny_hf.py counted by hand: vocab 259 (3 specials + 256
# bytes), hidden 32, MLP 64, 2 layers, 2 query heads / 1 KV head of 16, qkv biases, tied head.
#   embedding 259 x 32                                   =  8,288
#   per layer: q 32x32+32, k 32x16+16, v 32x16+16, o 32x32 = 3,136
#              SwiGLU 3 x 32 x 64                         =  6,144
#              two RMSNorms 2 x 32                        =     64  -> 9,344 x 2 = 18,688
#   final norm                                            =     32
TINY_QWEN_PARAMS = 8_288 + 18_688 + 32  # 27,008


def _cfg(tmp_path, model: dict) -> str:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump({"model": model}))
    return str(p)


def test_rpeg_plan_prices_the_model_path(user_files, tmp_path, capsys):
    cfg = _cfg(tmp_path, {"path": user_files["model"]})
    assert main(["plan", cfg, "--json", "--max-candidates", "4"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["model"] == "model"  # the folder's name, not rpeg-tiny
    assert main(["plan", cfg, "--max-candidates", "4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on model (27 K params)" in out  # sensible units, not "0.00 B"


def test_the_problem_holds_the_folder_shape(user_files):
    from rpeg.config import RunConfig
    from rpeg.search.problem import problem_from_config

    cfg = RunConfig().with_overrides({"model.path": user_files["model"]})
    m = problem_from_config(cfg).model
    assert (m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.vocab) == (
        2,
        32,
        64,
        2,
        1,
        259,
    )
    assert m.params == TINY_QWEN_PARAMS
    # a catalog name set beside the path is the user's word for the shape
    named = cfg.with_overrides({"model.name": "qwen2.5-0.5b-instruct"})
    assert problem_from_config(named).model.name == "qwen2.5-0.5b-instruct"


def test_the_runs_prediction_prices_the_model_path(user_files):
    """rpeg train's prediction (collective timeouts, out-of-memory messages, the plan report):
    the trainer's weights of the user's model in fp32 are 27,008 x 4 B."""
    from rpeg.config import RunConfig
    from rpeg.runtime.actors.predicted import prediction

    cfg = RunConfig().with_overrides({"model.path": user_files["model"]})
    pred = prediction(cfg)
    assert pred is not None
    assert pred.stages["train_actor"].memory_gb["weights"] == pytest.approx(
        TINY_QWEN_PARAMS * 4 / 1e9, rel=1e-9
    )


def test_a_folder_without_config_json_is_refused_naming_how_to_add_it(tmp_path, capsys):
    empty = tmp_path / "weights-only"
    empty.mkdir()
    assert main(["plan", _cfg(tmp_path, {"path": str(empty)})]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and "config.json" in err
    assert f"rpeg specs add-model --from-hf {empty}/config.json --name NAME" in err


def test_an_unknown_family_is_refused_naming_how_to_describe_it(tmp_path, capsys):
    folder = tmp_path / "gpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64}))
    assert main(["plan", _cfg(tmp_path, {"path": str(folder)})]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "model_type: got 'gpt2'" in err
    assert "models.yaml" in err and "set model.name" in err


def test_add_model_prints_small_counts_in_k(user_files, tmp_path, capsys, monkeypatch):
    from rpeg import specs

    monkeypatch.setenv("RPEG_SPECS_DIR", str(tmp_path / "specs"))
    specs.reload()
    try:
        cfg = f"{user_files['model']}/config.json"
        assert main(["specs", "add-model", "--from-hf", cfg, "--name", "my-tiny"]) == 0
        out = capsys.readouterr().out
        assert "27 K params" in out and "0.00 B" not in out
        assert main(["specs", "list"]) == 0
        line = next(s for s in capsys.readouterr().out.splitlines() if "my-tiny" in s)
        assert "27 K params" in line
    finally:
        monkeypatch.delenv("RPEG_SPECS_DIR")
        specs.reload()
