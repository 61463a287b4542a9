"""The policy model's architecture checked before anything starts (docs/models.md): a folder
whose config asks for custom code (``auto_map``) or names a ``model_type`` the installed
transformers does not build as a causal LM, and a compiled layout the model cannot run (a tp
that does not divide its heads, a plan style or a hybrid layer the runtime does not split),
each refused naming the model type, the layout and why
(rpeg.runtime.model_io.architectures). Only ``config.json`` is read; no code of the folder
runs."""

from __future__ import annotations

from typing import Any

from rpeg.config import RunConfig
from rpeg.errors import Problem


def check_architecture(config: RunConfig, compiled: Any = None) -> list[Problem]:
    """Problems of ``model.path``'s architecture and of every compiled group's tp for it
    (none without a folder; an unreadable folder is check_model's problem)."""
    path = config.model.path
    if not path:
        return []
    try:
        import json
        from types import SimpleNamespace

        import fsspec

        with fsspec.open(f"{path.rstrip('/')}/config.json", "r") as fh:
            fields = json.load(fh)
    except Exception:  # noqa: BLE001 -- check_model names an unreadable folder
        return []
    if not isinstance(fields, dict):
        return []
    from rpeg.runtime.model_io.architectures import config_problems, tp_problems

    out = config_problems(SimpleNamespace(**fields), "model.path")
    if out or compiled is None:
        return out
    policy = {"actor", "reference"} | (set() if config.model.critic_path else {"critic"})
    tps = sorted({g.tp for g in compiled.actor_groups if g.tp > 1 and set(g.roles) & policy})
    if not tps:
        return out
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    for tp in tps:
        names = [g.name for g in compiled.actor_groups if g.tp == tp and set(g.roles) & policy]
        out += tp_problems(cfg, tp, where=f"plan: group {', '.join(names)} (tp={tp})")
    return out

