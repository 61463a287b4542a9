"""Supervised warm-up: which models get it by default, and file data sets (finite lists)."""

from rpeg.config import RunConfig
from rpeg.runtime.data import Example
from rpeg.runtime.model_io import create_tiny
from rpeg.runtime.warmup import supervised_warmup

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}


def test_default_warmup_only_for_the_builtin_random_init_model():
    assert RunConfig().warmup_sft_steps == 150  # the tiny model starts from random weights
    loaded = RunConfig().with_overrides({"model.path": "/models/qwen"})
    assert loaded.warmup_sft_steps == 0  # a user's model is never fine-tuned unasked
    asked = loaded.with_overrides({"optim.warmup_sft_steps": 7})
    assert asked.warmup_sft_steps == 7


def test_warmup_draws_from_a_finite_file_data_set():
    model, tok = create_tiny(seed=0, **SMALL)
    data = [Example(question="1+1=", answer="2"), Example(question="2+2=", answer="4")]
    info = supervised_warmup(
        model, tok, data, steps=2, lr=1e-3, batch_size=4, template="{question}", seed=0
    )
    assert info["warmup_loss"] > 0
