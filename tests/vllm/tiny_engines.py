"""The tiny Hugging Face models and vLLM engines the tests here share (a helper module, not
collected): the shape, a model of a head kind and seed, an engine over it."""

from __future__ import annotations

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
)


def tiny(tied: bool, seed: int):
    """(model, char tokenizer): the tiny Llama of ``SHAPE``, random init under ``seed``."""
    from rpeg.runtime.model_io import create_model, tiny_config
    from rpeg.runtime.tokenizer import build_char_tokenizer

    cfg = tiny_config(**SHAPE)
    cfg.tie_word_embeddings = tied
    model = create_model(cfg, seed=seed).eval()
    return model, build_char_tokenizer()


def engine_of(model, tok):
    """A vLLM engine over ``model`` (fp32, 128-token context, 16 sequences at once)."""
    from rpeg.runtime.engines.vllm import VLLMEngine

    return VLLMEngine.from_model(
        model,
        pad_id=tok.pad_token_id,
        eos_id=tok.eos_token_id,
        dtype="float32",
        max_model_len=128,
        max_num_seqs=16,
    )
