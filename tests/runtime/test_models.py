"""Saving and loading models through fsspec, value heads, bad inputs."""

import pytest
import torch

from rpeg.errors import ConfigError
from rpeg.runtime.model_io import (
    ActorCritic,
    CriticModel,
    check_tokenizer,
    count_params,
    create_model,
    create_tiny,
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    save_pretrained,
    tiny_config,
)


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_shape():
    cfg = tiny_config()
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.intermediate_size,
    ) == (256, 4, 4, 1024)
    model, tok = create_tiny()
    assert count_params(model) == 4_222_208
    assert tok.pad_token_id == 0 and tok.bos_token_id == 1 and tok.eos_token_id == 2


def test_roundtrip_memory_fs(tiny):
    model, tok = tiny
    save_pretrained(model, tok, "memory://rpeg-test/tiny")
    m2, t2 = load_model_and_tokenizer("memory://rpeg-test/tiny")
    assert _same(model, m2)
    assert t2("1+2=")["input_ids"] == tok("1+2=")["input_ids"]


def test_roundtrip_local(tiny, tmp_path):
    model, tok = tiny
    save_pretrained(model, tok, str(tmp_path / "m"))
    assert (tmp_path / "m" / "model.safetensors").exists()
    assert _same(model, load_model(str(tmp_path / "m")))
    assert _same(model, load_model(f"file://{tmp_path / 'm'}"))
    from transformers import AutoTokenizer  # HF tooling loads the char tokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path / "m"), trust_remote_code=False)
    assert hf.decode(hf("7*8=")["input_ids"], skip_special_tokens=True) == "7*8="


def test_qwen_config_random_init():
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    m = create_model(cfg, seed=1)
    assert m.config.model_type == "qwen2"
    assert _same(m, create_model(cfg, seed=1))


def test_missing_model_path():
    with pytest.raises(ConfigError, match="not found"):
        load_model("/definitely/not/here")
    with pytest.raises(ConfigError, match="not found"):
        load_model("memory://nothing/here")


def test_tokenizer_without_special_tokens(tmp_path):
    class Tok:
        pad_token_id = None
        eos_token_id = 2

    with pytest.raises(ConfigError, match="lacks needed special tokens: pad"):
        check_tokenizer(Tok())
    # a saved tokenizer with the pad token stripped
    _, tok = create_tiny()
    tok.save_pretrained(tmp_path)
    import json

    cfg_path = tmp_path / "tokenizer_config.json"
    data = json.loads(cfg_path.read_text())
    data.pop("pad_token", None)
    cfg_path.write_text(json.dumps(data))
    st = tmp_path / "special_tokens_map.json"
    if st.exists():
        s = json.loads(st.read_text())
        s.pop("pad_token", None)
        st.write_text(json.dumps(s))
    with pytest.raises(ConfigError, match="pad"):
        load_tokenizer(str(tmp_path))


def test_value_heads(tiny):
    model, _ = tiny
    ids = torch.tensor([[1, 20, 21, 22]])
    ac = ActorCritic(model)
    out = ac(ids, keep_last=3)
    assert out.logits.shape == (1, 3, 100) and out.values.shape == (1, 3)
    torch.testing.assert_close(out.logits, model(ids).logits[:, -3:])  # same trunk, same logits
    import copy

    critic = CriticModel(copy.deepcopy(model))
    assert critic(ids).values.shape == (1, 4) and critic(ids).logits is None
