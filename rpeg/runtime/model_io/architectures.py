"""Which causal LMs the runtime trains, and in which layouts.

* Any ``model_type`` transformers implements as a causal LM (``AutoModelForCausalLM``'s
  mapping) is built from its own modeling code; a config asking for custom code
  (``auto_map``) is refused by name: remote code is never run (:func:`config_problems`).
* Tensor parallelism follows the model's own ``base_model_tp_plan`` (transformers ships one per
  config class); the styles this runtime runs are ``colwise``, ``rowwise`` (plain local
  matmuls over DTensor parameters: rpeg.runtime.tensor_parallel) and
  ``replicated_with_grad_allreduce`` (a per-head norm kept whole, its gradient summed over tp).
  A config without a plan takes the hand-written Megatron split
  (:data:`TP_PLAN`). A plan entry in any other style
  (``colwise_gather_output``, ``embedding_rowwise``, ...), a hybrid layer the plan does not
  split, or a tp that does not divide the heads is refused before start
  (:func:`tp_problems`), naming the model type, the layout and why.
* Mixture-of-experts blocks (experts, router) are not in the plans' ``colwise``/``rowwise``
  entries: at tp > 1 they stay whole on every tp rank (their input is already the full
  hidden state after the attention's row-wise sum), so they train correctly, unsplit.

Only configuration is read here (no weights): the preflight calls it before anything starts.
"""

from __future__ import annotations

from typing import Any

from rpeg.errors import Problem

# --- the decoder's split ---------------------------------------------------------------
#: submodule of a decoder block -> tensor-parallel style: the hand-written Megatron split of
#: attention and MLP, used only for a config without its own ``base_model_tp_plan``
#: (transformers ships one for Llama, Qwen2/3, Qwen3-MoE, Mixtral, Gemma 3, OLMo 2, ...;
#: rpeg.runtime.model_io.architectures.layer_tp_plan)
TP_PLAN: dict[str, str] = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def pretrained_model(module: Any) -> Any:
    """The first transformers ``PreTrainedModel`` in ``module`` (itself, an LM a wrapper
    holds, a critic's trunk), or None."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover
        return None
    return next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)


def decoder_layers(module: Any) -> list[Any]:
    """The decoder blocks of a causal LM, its trunk, or a wrapper holding one, in order: the
    modules of the model's own decoder-layer classes (its ``_no_split_modules``: what
    transformers keeps whole on one device), else ``model.layers`` / ``layers``."""
    from torch import nn

    lm = pretrained_model(module)
    names = set(getattr(lm, "_no_split_modules", None) or ())
    if names:
        found: list[Any] = []
        inside: set[int] = set()
        for m in module.modules():
            if id(m) in inside:
                continue
            if type(m).__name__ in names:
                found.append(m)
                inside.update(id(x) for x in m.modules())
        if found:
            return found
    for path in ("model.layers", "layers", "lm.model.layers", "trunk.layers"):
        obj: Any = module
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList):
            return list(obj)
    raise TypeError(f"{type(module).__name__} has no decoder layers (model.layers)")


#: the model types the test suite builds, trains and exports (tests/runtime/models)
TESTED_MODEL_TYPES = (
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

#: tensor-parallel styles of a transformers plan this runtime runs -> its own name
RUN_STYLES = {
    "colwise": "colwise",
    "rowwise": "rowwise",
    "replicated_with_grad_allreduce": "replicated",
}


def causal_lm_types() -> tuple[str, ...]:
    """Every ``model_type`` the installed transformers builds with ``AutoModelForCausalLM``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def config_problems(cfg: Any, where: str = "model.path") -> list[Problem]:
    """Why the runtime cannot build this config's model at all (any layout)."""
    mt = getattr(cfg, "model_type", None)
    out: list[Problem] = []
    auto_map = getattr(cfg, "auto_map", None)
    if auto_map:
        out.append(
            Problem(
                where,
                f"model_type {mt!r} asks for custom code (auto_map: {sorted(auto_map)}); "
                "remote code is never run: use a model transformers implements",
            )
        )
    types = causal_lm_types()
    if mt not in types:
        out.append(
            Problem(
                where,
                f"model_type {mt!r} is not a causal LM the installed transformers implements "
                f"({len(types)} are, e.g. {', '.join(TESTED_MODEL_TYPES)})",
            )
        )
    return out


def layer_tp_plan(cfg: Any) -> tuple[dict[str, str], str]:
    """(plan, source): the tensor-parallel style of each submodule of a decoder layer
    (``"self_attn.q_proj" -> "colwise"``; entries outside ``layers.*`` keep their full name)
    from the model's ``base_model_tp_plan``, or the hand-written plan when it has none;
    ``source`` says which ("transformers" / "rpeg")."""
    plan = getattr(cfg, "base_model_tp_plan", None)
    if not plan:
        return dict(TP_PLAN), "rpeg"
    out: dict[str, str] = {}
    for name, style in plan.items():
        out[name[len("layers.*.") :] if name.startswith("layers.*.") else name] = style
    return out, "transformers"


def hybrid_kinds(cfg: Any) -> list[str]:
    """Layer kinds other than (sliding / full / chunked) attention: linear attention, mamba."""
    kinds = getattr(cfg, "layer_types", None) or []
    return sorted({k for k in kinds if "attention" not in k or k.startswith("linear")})


def tp_problems(cfg: Any, tp: int, where: str = "plan.layout.tp") -> list[Problem]:
    """Why this model cannot run at tensor-parallel size ``tp`` (naming the model type, the
    layout and the reason), as problems; [] when it can."""
    if tp <= 1:
        return []
    mt = getattr(cfg, "model_type", "?")
    head = f"model_type {mt!r} cannot run at tp={tp}:"
    plan, source = layer_tp_plan(cfg)
    out: list[Problem] = []
    other = {n: s for n, s in plan.items() if s not in RUN_STYLES}
    if other:
        shown = ", ".join(f"{n} ({s})" for n, s in sorted(other.items()))
        out.append(
            Problem(
                where,
                f"{head} its tensor-parallel plan splits {shown}, styles this runtime does not "
                f"run (it runs {', '.join(RUN_STYLES)}); use tp=1 (dp, FSDP)",
            )
        )
    hybrid = hybrid_kinds(cfg)
    if hybrid and not other:
        out.append(
            Problem(
                where,
                f"{head} its {'/'.join(hybrid)} layers have no tensor-parallel split here; "
                "use tp=1 (dp, FSDP)",
            )
        )
    if not any(s in ("colwise", "rowwise") for s in plan.values()):
        if not out:
            out.append(Problem(where, f"{head} its {source} plan splits nothing; use tp=1"))
        return out
    sizes = ["num_attention_heads", "num_key_value_heads"]
    if "mlp.gate_proj" in plan or "mlp.up_proj" in plan:
        sizes.append("intermediate_size")
    if "mlp.shared_expert.gate_proj" in plan:
        sizes.append("shared_expert_intermediate_size")
    for name in sizes:
        n = getattr(cfg, name, None)
        if isinstance(n, int) and n % tp:
            out.append(Problem(where, f"{head} tp does not divide its {name}={n}"))
    return out


def build_problems(cfg: Any, where: str = "model.path", sharded: bool = False) -> list[Problem]:
    """Why the runtime cannot run this causal LM, found by building it on the meta device (no
    memory, no weights read): its config does not build, its LM head is not a Linear layer
    (log-probs are computed inside it: rpeg.runtime.model_io.logprobs), its forward takes no
    ``logits_to_keep`` / ``position_ids`` / ``attention_mask``, or (``sharded``: FSDP or tp in
    the plan) it has no decoder layers to shard."""
    import inspect

    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    mt = getattr(cfg, "model_type", "?")
    try:
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 -- any failure to build is the problem named
        why = f"{type(exc).__name__}: {exc}"
        return [Problem(where, f"model_type {mt!r} does not build from its config ({why[:200]})")]
    out: list[Problem] = []
    head = getattr(lm, "lm_head", None)
    if type(head) is not nn.Linear:
        out.append(
            Problem(
                where,
                f"model_type {mt!r} cannot run here: its LM head is {type(head).__name__}, not a "
                "Linear layer (the trainer computes per-token log-probs inside it)",
            )
        )
    params = inspect.signature(type(lm).forward).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        lacks = [n for n in ("logits_to_keep", "position_ids", "attention_mask") if n not in params]
        if lacks:
            out.append(
                Problem(where, f"model_type {mt!r} cannot run here: its forward takes no {lacks}")
            )
    if sharded:
        try:
            decoder_layers(lm)
        except TypeError:
            out.append(
                Problem(
                    where,
                    f"model_type {mt!r} has no decoder layers to shard (FSDP / tp): use a layout "
                    "without sharding",
                )
            )
    return out
