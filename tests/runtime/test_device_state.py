"""Models built on their device, and the CUDA RNG in a role's checkpoint (issue 26).

A GPU target is simulated with the ``meta`` device: a model that ends up there was never
filled in host memory by the loader (the read is asked for the target device), and the CUDA
RNG calls are doubles recording what a GPU process would get.
"""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch

from rpeg.runtime import model_io


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each family's 2-layer model saved as a Hugging Face folder -> {family: (model, dir)}."""
    out = {}
    for fam in ("llama", "qwen2", "qwen3"):
        m = C.model()[0] if fam == "llama" else C.family_model(fam)
        d = tmp_path_factory.mktemp(fam)
        model_io.save_pretrained(m, None, str(d))
        out[fam] = (m, str(d))
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_load_on_device_equals_from_pretrained(saved, family):
    """meta -> to_empty -> safetensors read on the device: the same weights, rotary buffers,
    tying and logits as ``from_pretrained`` (run here with the CPU as the device)."""
    from transformers import AutoConfig

    m, d = saved[family]
    got = model_io.load_on_device(
        d, AutoConfig.from_pretrained(d, trust_remote_code=False), "float32", "cpu"
    )
    ref = model_io.load_model(d)
    a, b = ref.state_dict(), got.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for name, buf in ref.named_buffers():
        assert torch.equal(buf, dict(got.named_buffers())[name]), name
    tied = getattr(m.config, "tie_word_embeddings", False)
    assert (got.lm_head.weight is got.model.embed_tokens.weight) == tied
    ids = torch.tensor([[1, 5, 9, 14, 2, 7]])
    with torch.no_grad():
        assert torch.equal(ref(input_ids=ids).logits, got(input_ids=ids).logits)
    assert not got.training


def test_a_gpu_target_is_read_straight_onto_the_device(saved, monkeypatch):
    """load_model(device=<not the CPU>) never takes from_pretrained's host path: every
    safetensors read is asked for the target device and every tensor ends up there."""
    import safetensors.torch as st
    from transformers import AutoModelForCausalLM

    real = st.load_file
    asked: list[str] = []

    def load_file(path, device="cpu"):
        asked.append(str(device))
        # the double reads the file, then hands meta tensors of the same shapes and dtypes
        return {k: torch.empty_like(v, device=device) for k, v in real(path).items()}

    monkeypatch.setattr(st, "load_file", load_file)
    monkeypatch.setattr(
        AutoModelForCausalLM,
        "from_pretrained",
        lambda *a, **k: pytest.fail("the host path was taken for a device target"),
    )
    _, d = saved["llama"]
    m = model_io.load_model(d, device=torch.device("meta"))
    assert asked and set(asked) == {"meta"}
    assert {p.device.type for p in m.parameters()} == {"meta"}
    assert {b.device.type for b in m.buffers()} == {"meta"}
    assert m.lm_head.weight is m.model.embed_tokens.weight


def test_a_checkpoint_missing_weights_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from rpeg.errors import ConfigError

    _, d = saved["qwen2"]
    import shutil

    shutil.copytree(d, tmp_path / "m")
    f = next((tmp_path / "m").glob("*.safetensors"))
    w = load_file(str(f))
    w.pop("model.norm.weight")
    save_file(w, str(f), metadata={"format": "pt"})
    cfg = AutoConfig.from_pretrained(d, trust_remote_code=False)
    with pytest.raises(ConfigError, match=r"missing \['model.norm.weight'\]"):
        model_io.load_on_device(str(tmp_path / "m"), cfg, "float32", "cpu")


def test_tiny_warm_up_runs_where_the_model_is_built(tmp_path, monkeypatch):
    """build_policy(device=...) warms the tiny model up on that device (here the CPU, passed
    explicitly) and gives the same weights as the default path."""
    from rpeg.runtime.role_builder import build_policy

    monkeypatch.setenv("RPEG_CACHE", str(tmp_path))
    cfg = C.config(**{"optim.warmup_sft_steps": 2, "model.tiny_shape": dict(C.SHAPE)})
    a, _, info = build_policy(cfg, device=torch.device("cpu"))
    assert info["warmup_cached"] == 0.0
    monkeypatch.setenv("RPEG_CACHE", str(tmp_path / "other"))
    b, _, _ = build_policy(cfg)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


class FakeCuda:
    """torch.cuda's RNG calls on a process that sees ``n`` GPUs."""

    def __init__(self, monkeypatch, n: int, states=None):
        self.set: dict[int, torch.Tensor] = {}
        self.states = states
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(
            torch.cuda, "set_rng_state", lambda st, device=0: self.set.__setitem__(device, st)
        )


def _worker():
    m, tok = C.model()
    return C.policy(C.config(), m, tok)


def test_cuda_rng_is_checkpointed_and_restored(monkeypatch):
    from rpeg.runtime.actors.checkpoint import dumps, loads

    states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    FakeCuda(monkeypatch, 2, states)
    w = _worker()
    st = loads(dumps(w.state_dict()))  # the checkpoint's own format (no pickle)
    assert [torch.equal(a, b) for a, b in zip(st["cuda_rng"], states, strict=True)] == [1, 1]
    fake = FakeCuda(monkeypatch, 2, states)
    w.load_state_dict(st)
    assert sorted(fake.set) == [0, 1]
    assert all(torch.equal(fake.set[i], states[i]) for i in (0, 1))
    # resumed on a process seeing one GPU: that one is restored
    one = FakeCuda(monkeypatch, 1, states)
    w.load_state_dict(st)
    assert sorted(one.set) == [0]


def test_no_cuda_no_cuda_rng(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    w = _worker()
    st = w.state_dict()
    assert "cuda_rng" not in st
    w.load_state_dict(st)  # and a GPU checkpoint resumed on the CPU restores the rest
    st["cuda_rng"] = [torch.zeros(16, dtype=torch.uint8)]
    w.load_state_dict(st)
