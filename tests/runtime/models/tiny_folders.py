"""Tiny random Hugging Face folders of today's architectures (tests/runtime/models).

:func:`write_tiny_folder` builds a model of ``model_type`` from its transformers config class
(2 layers, hidden size 32, 4 query heads of 8 over 2 kv heads, random weights under a seed),
writes it with ``save_pretrained`` (safetensors, in the checkpoint layout transformers
writes: a mixture-of-experts model's experts one file entry each) and puts the built-in
tiny model's character tokenizer beside it (vocabulary 100: the built-in task runs on it).
"""

from __future__ import annotations

from pathlib import Path

#: every architecture the tests build; the hybrid one (linear + full attention) last
MODEL_TYPES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
    "gemma3_text",
    "olmo2",
    "qwen3_next",
)
MOE_TYPES = ("qwen3_moe", "mixtral", "gpt_oss", "qwen3_next")

_COMMON = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
}
_MOE = {"num_experts_per_tok": 2, "router_aux_loss_coef": 0.01}
_EXTRA: dict[str, dict] = {
    "qwen3_moe": {**_MOE, "num_experts": 4, "moe_intermediate_size": 32, "mlp_only_layers": []},
    "mixtral": {**_MOE, "num_local_experts": 4},
    "gpt_oss": {
        **_MOE,
        "num_local_experts": 4,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "gemma3_text": {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    "qwen3_next": {
        **_MOE,
        "num_experts": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
    },
}


def tiny_hf_config(model_type: str, **over):
    """The transformers config of the tiny ``model_type`` model (char vocabulary of 100)."""
    from transformers import AutoConfig

    from rpeg.runtime.tokenizer import char_vocab

    v = char_vocab()
    fields = {
        **_COMMON,
        **_EXTRA.get(model_type, {}),
        "vocab_size": len(v),
        "pad_token_id": v["<pad>"],
        "bos_token_id": v["<bos>"],
        "eos_token_id": v["<eos>"],
        **over,
    }
    return AutoConfig.for_model(model_type, **fields)


def write_tiny_folder(model_type: str, path: str | Path, seed: int = 0, **over) -> Path:
    """Write a random tiny ``model_type`` model (safetensors) and the char tokenizer to
    ``path``; returns ``path``."""
    import torch
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.tokenizer import build_char_tokenizer

    cfg = tiny_hf_config(model_type, **over)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.pad_token_id = cfg.pad_token_id
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    build_char_tokenizer().save_pretrained(path)
    return path


def replay_rollout(worker, prompts: list[list[int]], max_new_tokens: int):
    """A rollout batch of ``prompts`` sampled by ``worker`` (a PolicyWorker recording its
    experts: ``routes``), then its model's routers moved away from that choice, as a
    trainer's are once its weights moved (routing-replay tests)."""
    import torch

    from rpeg.runtime.batch import RolloutBatch
    from rpeg.runtime.engines.base import SamplingParams
    from rpeg.runtime.engines.torch_engine import left_pad
    from rpeg.runtime.model_io.routing import routers

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    out = worker.generate(prompts, params, seed=3)
    ids, pmask = left_pad(prompts, 0)
    n = len(prompts)
    batch = RolloutBatch(
        prompt_ids=ids,
        prompt_mask=pmask,
        response_ids=out.response_ids,
        response_mask=out.mask,
        sample_logprobs=out.logprobs,
        policy_version=torch.zeros(n, dtype=torch.long),
        group_ids=torch.arange(n),
        routes=out.routes,
    )
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for r in routers(worker.lm):
            r.weight.add_(3 * torch.randn(r.weight.shape, generator=g))
    return batch
