"""Causal LMs through Hugging Face transformers, value heads, and the built-in tiny model.

* :func:`load_model` / :func:`load_tokenizer` read a local folder or any fsspec URL (a remote
  folder is copied to a local temp dir first, then loaded with safetensors).
* :func:`save_pretrained` writes model + tokenizer to a local folder or an fsspec URL.
* :func:`create_model` builds a random-init model from a ``transformers`` config (any causal
  LM transformers implements; custom code refused);
  :func:`tiny_config` is the built-in ``rpeg-tiny`` family (Llama arch).
* :class:`CriticModel` is a separate critic (trunk + scalar value head);
  :class:`ActorCritic` shares the actor's trunk: one forward gives logits and values.
* :func:`lm_logprobs` runs a causal LM and returns per-token log-probs of given labels
  computed chunk by chunk inside the LM head (:class:`TokenLogprobHead`), so the
  full-vocabulary fp32 logits of a micro-batch never exist at once. The computation stays
  inside the LM's own ``forward``: FSDP2's hooks on the LM gather and reduce the head's
  (often tied) weight as for any other forward.

What each module holds: ``loading`` (folders, URLs, tokenizers, the tiny model, saving),
``architectures`` (which causal LMs and tensor-parallel plans run: docs/models.md),
``checkpoint_names`` (a MoE folder's per-expert tensors as the model holds them, one at a
time), ``moe`` (the router's load-balancing loss and load metrics), ``routing`` (routes
recorded and replayed), ``value_heads`` (critic and actor-critic), ``logprobs`` (chunked
per-token log-probs).
"""

from rpeg.runtime.model_io.loading import (
    REQUIRED_SPECIAL_TOKENS,
    SUPPORTED_MODEL_TYPES,
    TINY_SHAPE,
    check_tokenizer,
    count_params,
    create_model,
    create_tiny,
    fetch_folder,
    load_model,
    load_model_and_tokenizer,
    load_on_device,
    load_tokenizer,
    save_pretrained,
    tiny_config,
    torch_dtype,
)
from rpeg.runtime.model_io.logprobs import (
    LogprobRequest,
    TokenLogprobHead,
    install_logprob_head,
    lm_logprobs,
)
from rpeg.runtime.model_io.value_heads import (
    ActorCritic,
    CriticModel,
    ModelOutput,
    ValueHead,
    trunk_of,
)

__all__ = [
    "ActorCritic",
    "CriticModel",
    "LogprobRequest",
    "ModelOutput",
    "REQUIRED_SPECIAL_TOKENS",
    "SUPPORTED_MODEL_TYPES",
    "TINY_SHAPE",
    "TokenLogprobHead",
    "ValueHead",
    "fetch_folder",
    "check_tokenizer",
    "count_params",
    "create_model",
    "create_tiny",
    "install_logprob_head",
    "lm_logprobs",
    "load_model",
    "load_model_and_tokenizer",
    "load_on_device",
    "load_tokenizer",
    "save_pretrained",
    "tiny_config",
    "torch_dtype",
    "trunk_of",
]
