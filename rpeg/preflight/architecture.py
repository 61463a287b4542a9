"""The policy model's architecture checked before anything starts (docs/models.md): a folder
whose config asks for custom code (``auto_map``) or names a ``model_type`` the installed
transformers does not build as a causal LM, and a compiled layout the model cannot run (a tp
that does not divide its heads, a plan style or a hybrid layer the runtime does not split),
each refused naming the model type, the layout and why
(rpeg.runtime.model_io.architectures), and a model the trainer cannot run (an LM head that
is not a Linear layer, a forward without ``logits_to_keep``: the model is built on the meta
device to see), and ``algorithm.routing_replay`` on a model without experts or with a
generation engine that cannot record routes. Only ``config.json`` is read; no code of the
folder runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpeg.config import RunConfig
from rpeg.errors import Problem

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep, GroupSpec


def check_architecture(config: RunConfig, compiled: CompiledStep | None = None) -> list[Problem]:
    """Problems of ``model.path``'s architecture and of every compiled group's tp for it
    (none without a folder; an unreadable folder is check_model's problem)."""
    path = config.model.path
    replay = config.algorithm.routing_replay != "off"
    out = routing_engine_problems(config, compiled) if replay else []
    if not path:
        return out + (routing_model_problems(config, None) if replay else [])
    try:
        import json
        from types import SimpleNamespace

        import fsspec

        with fsspec.open(f"{path.rstrip('/')}/config.json", "r") as fh:
            fields = json.load(fh)
    except Exception:  # noqa: BLE001 -- check_model names an unreadable folder
        return out
    if not isinstance(fields, dict):
        return out
    from rpeg.runtime.model_io.architectures import build_problems, config_problems, tp_problems

    out += config_problems(SimpleNamespace(**fields), "model.path")
    if out:
        return out
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.for_model(
            fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"}
        )
    except Exception as exc:  # noqa: BLE001 -- a config transformers refuses, named
        return [Problem("model.path", f"config.json does not read as its model_type's: {exc}")]
    if replay:
        out += routing_model_problems(config, cfg)
    groups = compiled.actor_groups if compiled is not None else ()
    sharded = any(g.tp > 1 or (g.fsdp and g.dp > 1) for g in groups)
    out += build_problems(cfg, "model.path", sharded=sharded)
    if out or compiled is None:
        return out
    policy = {"actor", "reference"} | (set() if config.model.critic_path else {"critic"})
    held = [g for g in compiled.actor_groups if set(g.roles) & policy]
    tps = sorted({t for g in held for t in (g.tp, _torch_gen_tp(g)) if t > 1})
    for tp in tps:
        names = [g.name for g in held if tp in (g.tp, _torch_gen_tp(g))]
        out += tp_problems(cfg, tp, where=f"plan: group {', '.join(names)} (tp={tp})")
    return out


def routing_model_problems(config: RunConfig, cfg: Any) -> list[Problem]:
    """``algorithm.routing_replay`` on a model without experts (``cfg`` None: the built-in
    dense model)."""
    from rpeg.runtime.model_io.moe import num_experts

    if cfg is not None and num_experts(cfg):
        return []
    what = "the built-in tiny model" if cfg is None else f"model_type {cfg.model_type!r}"
    return [
        Problem(
            "algorithm.routing_replay",
            f"{config.algorithm.routing_replay!r} needs a mixture-of-experts model; {what} has "
            "no experts: set it to off",
        )
    ]


def routing_engine_problems(config: RunConfig, compiled: CompiledStep | None) -> list[Problem]:
    """``algorithm.routing_replay`` with vLLM generating: only the torch engine records the
    experts each token was routed to (docs/models.md; why not vLLM: docs/vllm.md "Routed
    experts")."""
    from rpeg.runtime.engines.vllm_requests import routes_refusal

    engines: set[str] = {config.runtime.engine}
    if compiled is not None:
        engines |= {g.gen_engine for g in compiled.actor_groups if g.gen_engine}
    if "vllm" not in engines:
        return []
    return [
        Problem(
            "algorithm.routing_replay",
            f"{config.algorithm.routing_replay!r} needs the torch engine (it records each "
            f"token's experts); vLLM generates in this run and {routes_refusal()}: set the "
            "engine to torch or routing_replay to off",
        )
    ]


def _torch_gen_tp(group: GroupSpec) -> int:
    """The tp at which ``group``'s torch engine splits the model to decode (1 when it decodes
    nothing or vLLM decodes: vLLM splits the model its own way)."""
    torch_engine = group.gen_engine == "torch" or (
        group.gen_engine == "auto" and group.device_type == "cpu"
    )
    return group.gen_tp if torch_engine else 1
