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
    held = [g for g in compiled.actor_groups if set(g.roles) & policy]
    tps = sorted({t for g in held for t in (g.tp, _torch_gen_tp(g)) if t > 1})
    if not tps:
        return out
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    for tp in tps:
        names = [g.name for g in held if tp in (g.tp, _torch_gen_tp(g))]
        out += tp_problems(cfg, tp, where=f"plan: group {', '.join(names)} (tp={tp})")
    return out


def _torch_gen_tp(group: Any) -> int:
    """The tp at which ``group``'s torch engine splits the model to decode (1 when it decodes
    nothing or vLLM decodes: vLLM splits the model its own way)."""
    torch_engine = group.gen_engine == "torch" or (
        group.gen_engine == "auto" and group.device_type == "cpu"
    )
    return group.gen_tp if torch_engine else 1
