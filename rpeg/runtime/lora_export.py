"""``rpeg export`` of a LoRA run (``model.lora``): its checkpoints hold the adapters only, so
the base model is rebuilt from the run's config (``model.path``, or the built-in tiny model
with its cached warm-up: rpeg.runtime.role_builder.build_policy) and two things are written:

* ``<out>/adapter/``: peft's ``adapter_config.json`` + ``adapter_model.safetensors``
  (``PeftModel.from_pretrained(base, "<out>/adapter")`` loads it);
* ``<out>/``: the merged model (``W + alpha/rank * B @ A``), a plain Hugging Face folder that
  ``AutoModelForCausalLM`` and vLLM load, as a full fine-tune's export is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from rpeg.errors import ConfigError, Problem
from rpeg.runtime.actors.checkpoint import CheckpointError
from rpeg.runtime.lora import adapter_keys, peft_config

#: where the adapter goes under the export folder
ADAPTER_DIR = "adapter"
#: what peft's model wrapper puts before the causal LM's own names
_PEFT_PREFIX = "base_model.model."


def export_lora(
    weights: Mapping[str, torch.Tensor],
    out: str,
    config: Any,
    *,
    dtype: str | None = None,
    log: Callable[[str], None] | None = None,
    saved: Mapping[str, Any] | None = None,
) -> None:
    """Write the adapters of ``weights`` (a LoRA checkpoint's LM state) to ``<out>/adapter``
    and the merged model to ``out``; ``config``: the run's config (base model, model.lora),
    whose model.lora must be ``saved`` (the one the commit marker records) when given -- a
    different alpha would merge with the wrong scale."""
    if config is None or config.model.lora is None:
        raise ConfigError(
            [
                Problem(
                    "--config",
                    "the checkpoint holds LoRA adapters only: name the run's config (with its "
                    "model.lora and base model) so the base can be rebuilt",
                )
            ]
        )
    import json

    given_lora = json.loads(json.dumps(config.model.lora.model_dump()))
    if saved is not None and given_lora != saved:
        raise ConfigError(
            [
                Problem(
                    "--config",
                    f"model.lora {given_lora} is not the checkpoint's {dict(saved)}: name the "
                    "config of the run that wrote it",
                )
            ]
        )
    from peft import get_peft_model

    from rpeg.runtime.model_io import save_pretrained, torch_dtype
    from rpeg.runtime.role_builder import build_policy

    base, tok, _ = build_policy(config, log)  # the warm-up comes from its cache
    model = get_peft_model(base, peft_config(config.model.lora))
    given = {_PEFT_PREFIX + k: weights[k] for k in adapter_keys(weights)}
    want = {k for k in model.state_dict() if k in given or ".lora_" in k}
    if want != set(given):
        raise CheckpointError(
            f"the checkpoint's adapters do not fit model.lora: missing "
            f"{sorted(want - set(given))[:3]}, unexpected {sorted(set(given) - want)[:3]}"
        )
    model.load_state_dict(given, strict=False)
    model.peft_config["default"].base_model_name_or_path = config.model.path
    save_pretrained(model, None, f"{out.rstrip('/')}/{ADAPTER_DIR}")  # peft's own files
    merged = model.merge_and_unload()
    if dtype:
        merged = merged.to(torch_dtype(dtype))
    save_pretrained(merged, tok, out)
    if log:
        log(f"LoRA: {sum(v.numel() for v in given.values()):,} adapter parameters, merged")
