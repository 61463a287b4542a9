"""A user's model and data as they would have them, built here: a tiny Qwen2-architecture
Hugging Face folder whose tokenizer has a chat template (char-level, Qwen's ``<|im_start|>``
/ ``<|im_end|>`` special tokens), a verl-format Parquet (``data_source``, ``prompt`` = chat
messages, ``ability``, ``reward_model: {style, ground_truth}``, ``extra_info``) and TRL's
conversational JSONL (``prompt`` = messages, ``answer``)."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Qwen-style ChatML (the real Qwen2 template also adds a default system message)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QUESTIONS = [(f"What is {a} plus {b}?", str(a + b)) for a in range(1, 7) for b in (1, 2, 30, 400)]


def build_tokenizer():
    """Byte-level BPE without merges (one token a byte), as Qwen2's tokenizer class loads it
    (transformers rebuilds a qwen2 model's tokenizer from its vocab and merges)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_qwen(path: str | Path, seed: int = 0) -> Path:
    """Write a random-init tiny Qwen2 model with the chat tokenizer to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = build_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def write_verl_parquet(path: str | Path, n: int = 24) -> Path:
    """verl's GSM8K preprocessing layout (examples/data_preprocess/gsm8k.py's columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (q, a) in enumerate(QUESTIONS[:n]):
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{q} Answer after ####."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"split": "train", "index": i},
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return Path(path)


def write_trl_jsonl(path: str | Path, n: int = 24) -> Path:
    """TRL's conversational prompt-only format (``prompt`` = messages) with an answer."""
    with open(path, "w") as fh:
        for q, a in QUESTIONS[:n]:
            fh.write(json.dumps({"prompt": [{"role": "user", "content": q}], "answer": a}) + "\n")
    return Path(path)
