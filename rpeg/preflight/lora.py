"""``model.lora`` checked before anything starts (docs/lora.md): the target modules against a
model folder's architecture (built on the meta device: no weights read), and the compiled
plan's layouts (LoRA with tensor parallelism in a group that trains the actor is refused)."""

from __future__ import annotations

from typing import Any

from rpeg.config import RunConfig
from rpeg.errors import Problem


def check_lora(config: RunConfig, compiled: Any = None) -> list[Problem]:
    lora = config.model.lora
    if lora is None:
        return []
    out: list[Problem] = []
    if config.model.path:
        out += _target_problems(config.model.path, lora.target_modules)
    for g in getattr(compiled, "actor_groups", ()) or ():
        if "actor" in g.trainable and g.tp > 1:
            out.append(
                Problem(
                    "model.lora",
                    f"LoRA with tensor parallelism is not supported: group {g.name} trains the "
                    f"actor at tp={g.tp}; plan the trainer with tp 1 (FSDP or data-parallel "
                    "replicas) or drop model.lora",
                )
            )
    return out


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
