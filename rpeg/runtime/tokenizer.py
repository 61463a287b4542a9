"""A character-level tokenizer built offline with the ``tokenizers`` library.

Saved in Hugging Face format (``PreTrainedTokenizerFast`` with ``<pad>``, ``<bos>``, ``<eos>``,
``<unk>``) so ``AutoTokenizer.from_pretrained`` loads it. Vocabulary: the four special
tokens (ids 0..3) then printable ASCII (space .. ``~``) and newline: 100 tokens.
"""

from __future__ import annotations

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


def char_vocab() -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    return vocab


def build_char_tokenizer():
    """Return a ``PreTrainedTokenizerFast``; encoding adds ``<bos>`` in front by default."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = char_vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(.|\n)"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
    return fast


assert len(char_vocab()) == 100, "char vocabulary size changed"
