"""Any causal LM transformers implements (issue 40 item 1): each tiny random folder of
tests/runtime/models/tiny_folders.py trains one step in the single-process trainer on the
built-in task, generates, checkpoints, and its export reloads in transformers with the
trainer's logits; custom code and layouts a model cannot run are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from tests.runtime.models.tiny_folders import MODEL_TYPES, tiny_hf_config, write_tiny_folder

IDS = torch.tensor([[1, 40, 41, 17, 42, 2, 5, 9]])


def run_config(folder, out, **over) -> RunConfig:
    cfg = RunConfig.from_dict(
        {
            "model": {"path": str(folder)},
            "workload": {
                "num_prompts": 2,
                "samples_per_prompt": 2,
                "max_response_tokens": 4,
                "train_minibatches": 1,
            },
            "task": {"heldout_size": 2},
            "algorithm": {"entropy_coef": 0.05},  # a random model's rewards are all 0: move it
            "runtime": {
                "steps": 1,
                "output_dir": str(out / "out"),
                "checkpoint_url": str(out / "ckpt"),
                "checkpoint_every": 1,
                "export_hf": True,
            },
        }
    )
    return cfg.with_overrides(over) if over else cfg


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_trains_generates_and_exports(model_type, tmp_path):
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.local_trainer import LocalTrainer

    folder = write_tiny_folder(model_type, tmp_path / "model")
    trainer = LocalTrainer(run_config(folder, tmp_path))
    summary = trainer.run()
    assert summary is not None
    lm = trainer.actor.lm
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert type(lm).__name__ == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]  # its own class
    start = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=False).eval()
    hf = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "out" / "hf" / "step-00000001"), trust_remote_code=False
    ).eval()
    lm.eval()
    with torch.no_grad():
        mine = lm(input_ids=IDS).logits
        theirs = hf(input_ids=IDS).logits
        before = start(input_ids=IDS).logits
    torch.testing.assert_close(theirs, mine, atol=1e-6, rtol=0)
    assert not torch.allclose(before, theirs)  # the trained weights, not the starting ones


def test_custom_code_and_unknown_types_are_refused_by_name(tmp_path):
    from rpeg.runtime.model_io import load_model

    folder = write_tiny_folder("llama", tmp_path / "custom")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"model.path.*'llama' asks for custom code \(auto_map"):
        load_model(str(folder))
    cfg.pop("auto_map")
    cfg["model_type"] = "t5"  # an encoder-decoder: transformers has no causal LM of it
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="'t5' is not a causal LM"):
        load_model(str(folder))


@pytest.mark.parametrize(
    ("model_type", "tp", "reason"),
    [
        ("olmo2", 2, r"splits self_attn.k_proj \(colwise_gather_output\)"),
        ("gpt_oss", 2, r"splits embed_tokens \(embedding_rowwise\)"),
        ("qwen3_next", 2, r"linear_attn.in_proj_ba \(colwise_gather_output\)"),
        ("llama", 3, "tp does not divide its num_attention_heads=4"),
        ("qwen3_moe", 4, "tp does not divide its num_key_value_heads=2"),
    ],
)
def test_a_layout_a_model_cannot_run_is_named(model_type, tp, reason):
    from rpeg.runtime.model_io.architectures import tp_problems

    probs = tp_problems(tiny_hf_config(model_type), tp)
    text = " | ".join(p.what for p in probs)
    assert f"model_type {model_type!r} cannot run at tp={tp}:" in text
    import re

    assert re.search(reason, text), text


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe", "mixtral", "gemma3_text"])
def test_tp2_runs_the_models_own_plan(model_type):
    from rpeg.runtime.model_io.architectures import layer_tp_plan, tp_problems

    cfg = tiny_hf_config(model_type)
    assert tp_problems(cfg, 2) == []
    plan, source = layer_tp_plan(cfg)
    assert source == "transformers"
    assert plan["self_attn.o_proj"] == "rowwise"


def test_fsdp_units_are_the_models_decoder_layer_classes():
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.model_io import ActorCritic
    from rpeg.runtime.model_io.architectures import decoder_layers

    for model_type in ("qwen3_next", "gemma3_text", "gpt_oss"):
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(tiny_hf_config(model_type))
        blocks = decoder_layers(lm)
        assert [type(b).__name__ for b in blocks] == [next(iter(lm._no_split_modules))] * 2
        assert blocks == list(lm.model.layers)
        assert decoder_layers(ActorCritic(lm)) == blocks


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "qwen3_next", "gemma3_text"])
def test_sharded_build_reads_the_folder_as_transformers_does(model_type, tmp_path, monkeypatch):
    """The meta-device build (FSDP / tp ranks) fills a MoE model from per-expert files tensor
    by tensor (the folder is never loaded whole: from_pretrained is not called) and
    recomputes Gemma's non-persistent ``embed_scale``: the logits of from_pretrained."""
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.materialize import SafetensorsSource, materialize, meta_causal_lm

    folder = write_tiny_folder(model_type, tmp_path / "m")
    ref = AutoModelForCausalLM.from_pretrained(str(folder)).eval()

    def whole(*a, **k):
        raise AssertionError("the sharded build loaded the folder whole")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", whole)
    src = SafetensorsSource(folder)
    meta = meta_causal_lm(ref.config, torch.float32)
    materialize(meta, torch.device("cpu"), src.fetch, "actor")
    with torch.no_grad():
        torch.testing.assert_close(meta.eval()(input_ids=IDS).logits, ref(input_ids=IDS).logits)


@pytest.mark.parametrize(
    ("model_type", "refused", "decode_only"),
    [("olmo2", True, False), ("olmo2", True, True), ("qwen3_moe", False, False)],
)
def test_a_tp_plan_the_model_cannot_run_is_refused_before_start(
    model_type, refused, decode_only, tmp_path
):
    """tp=2 for every unit, or only for the torch engine's decode (``decode_only``)."""
    import yaml

    from rpeg.preflight import preflight

    folder = write_tiny_folder(model_type, tmp_path / model_type)
    from pathlib import Path

    data = yaml.safe_load((Path(__file__).parents[3] / "configs" / "tp2-cpu.yaml").read_text())
    data["model"] = {"path": str(folder)}
    data["plan"].pop("model")
    if decode_only:
        for unit, opts in data["plan"]["units"].items():
            if unit != "generate":
                opts.pop("tp", None)
    data["runtime"] = {"output_dir": str(tmp_path / "out")}
    cfg = RunConfig.from_dict(data)
    if not refused:
        assert preflight(cfg, cluster_devices=2) is not None
        return
    with pytest.raises(ConfigError) as err:
        preflight(cfg, cluster_devices=2)
    text = str(err.value)
    assert "before anything started" in text
    assert "model_type 'olmo2' cannot run at tp=2" in text and "colwise_gather_output" in text


#: what the catalog's derived count leaves out (docs/models.md): gpt-oss's attention sinks and
#: biases, Gemma 3's two extra norms a layer, OLMo 2's q/k norms over all heads (priced per head),
#: Qwen3-Next's per-head gated-attention norms
APPROXIMATE = {"gpt_oss": 0.03, "gemma3_text": 0.01, "olmo2": 0.01, "qwen3_next": 0.01}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_planner_prices_the_model_the_runtime_builds(model_type, tmp_path):
    """The catalog entry read from the folder's config.json (what `rpeg plan` / `rpeg bench`
    price for ``model.path``) counts the parameters transformers builds."""
    from transformers import AutoModelForCausalLM

    from rpeg.specs.hf import model_from_folder

    folder = write_tiny_folder(model_type, tmp_path / model_type)
    spec = model_from_folder(str(folder))
    with torch.device("meta"):
        built = sum(
            p.numel() for p in AutoModelForCausalLM.from_config(spec_cfg(folder)).parameters()
        )
    rel = APPROXIMATE.get(model_type, 0.0)
    assert spec.params == pytest.approx(built, rel=rel, abs=0)


def spec_cfg(folder):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)


def test_a_causal_lm_the_trainer_cannot_run_is_refused_by_name(tmp_path):
    """RoBERTa is in transformers' causal-LM mapping (as a decoder) but its LM head is no
    Linear layer: refused before start, naming the type and why; every tested type passes."""
    from transformers import AutoConfig

    from rpeg.preflight.architecture import check_architecture

    def problems(folder):
        cfg = RunConfig.from_dict({"model": {"path": str(folder)}})
        return [p.what for p in check_architecture(cfg)]

    folder = tmp_path / "roberta"
    folder.mkdir()
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    AutoConfig.for_model("roberta", is_decoder=True, **small).to_json_file(folder / "config.json")
    (msg,) = problems(folder)
    assert "model_type 'roberta' cannot run here: its LM head is RobertaLMHead" in msg
    for model_type in MODEL_TYPES:
        assert problems(write_tiny_folder(model_type, tmp_path / model_type)) == []
