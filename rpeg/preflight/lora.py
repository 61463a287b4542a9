"""``model.lora`` checked before anything starts (docs/lora.md): the target modules against a
model folder's architecture (built on the meta device: no weights read). Every layout of the
compiled plan is accepted: FSDP and data parallelism wrap the injected model as any model,
tensor parallelism splits the adapters with their targets (rpeg.runtime.lora_tp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rpeg.config import RunConfig
from rpeg.errors import Problem

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep


def check_lora(config: RunConfig, compiled: CompiledStep | None = None) -> list[Problem]:
    """Problems of ``model.lora`` (none without it); ``compiled``: the compiled plan, whose
    layouts need no check since LoRA runs at every tp, dp and FSDP layout the plan allows."""
    lora = config.model.lora
    if lora is None or not config.model.path:
        return []
    return _target_problems(config.model.path, lora.target_modules)


def _target_problems(path: str, targets: list[str]) -> list[Problem]:
    """Unknown target modules of the model in ``path`` (its config.json only, built on the meta
    device); a folder that cannot be read is check_model's problem, not this one's."""
    try:
        import json

        import fsspec
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from rpeg.runtime.lora import linear_names

        with fsspec.open(f"{path.rstrip('/')}/config.json", "r") as fh:
            fields = json.load(fh)
        cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception:  # noqa: BLE001 -- check_model names an unreadable folder
        return []
    have = linear_names(model)
    unknown = [t for t in targets if t not in have]
    if not unknown:
        return []
    return [
        Problem(
            "model.lora.target_modules",
            f"{unknown} are not Linear layers of the model (allowed: {', '.join(have)})",
        )
    ]
