import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny():
    """A small random-init model of the tiny family (2 layers, hidden 64) + char tokenizer."""
    from rpeg.runtime.model_io import create_tiny

    model, tok = create_tiny(
        seed=0,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model.eval()
    return model, tok
