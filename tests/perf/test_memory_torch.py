"""The training-state memory terms against torch's own tracker
(torch.distributed._tools.mem_tracker.MemTracker) on a real HF model class under
FakeTensorMode (no memory is allocated), one rank (dp = 1).

The model prices Megatron-style mixed precision: bf16 weights (2 B) + bf16 gradients (2 B) +
fp32 master weights and Adam moments (12 B) = 16 B per parameter. Plain fp32 AdamW, which
MemTracker sees here, keeps fp32 weights (4 B) + fp32 gradients (4 B) + two fp32 moments (8 B):
the same 16 B per parameter in another split, so the totals must agree (tolerance 0.5%: the
tracker's allocator rounding). This checks the parameter count torch sees (tied embeddings,
biases, norms) and the optimizer-state multiplicity, at the real width of Qwen2.5-0.5B (2 of its
24 layers, to stay fast). Activation memory is not compared: the model's constant is the
Megatron one (34 B per hidden unit per token per layer, Korthikanti et al. 2022) for fused
kernels, which the eager HF module does not use.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from rpeg.ir import builders  # noqa: E402
from rpeg.perf import Workload, predict  # noqa: E402
from rpeg.plan import colocated_plan  # noqa: E402
from rpeg.specs.hf import entry_from_hf  # noqa: E402
from rpeg.specs.models import parse_models  # noqa: E402


def test_training_state_matches_memtracker():
    cfg = transformers.Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    cfg._attn_implementation = "sdpa"
    with FakeTensorMode():
        model = transformers.Qwen2ForCausalLM(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        ids = torch.zeros(1, 128, dtype=torch.long)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            model(input_ids=ids).logits.float().sum().backward()
            opt.step()
        snap = next(iter(mt.get_tracker_snapshot("current").values()))
    by = {str(k).split(".")[-1]: v for k, v in snap.items()}
    torch_state = by["PARAM"] + by["GRAD"] + by["OPT"]

    spec = parse_models([({"models": {"q": entry_from_hf(cfg.to_dict())}}, "test")])["q"]
    g = builders.build("grpo", use_reference=False)
    plan = colocated_plan(g, "dgx-h100", num_devices=1, model="qwen2.5-0.5b-instruct")
    wl = Workload(
        num_prompts=1,
        samples_per_prompt=1,
        mean_prompt_tokens=64,
        max_response_tokens=64,
        mean_response_tokens=32,
    )
    pred = predict(g, plan, wl, model=spec, check_memory=False)
    mem = pred.stages["train_actor"].memory_gb
    ours = (mem["weights"] + mem["gradients"] + mem["optimizer"]) * 1e9
    assert ours == pytest.approx(torch_state, rel=5e-3)
