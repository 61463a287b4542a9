"""A catalog model entry from a Hugging Face ``config.json`` (pure: reads JSON, runs nothing).

``entry_from_hf(config)`` maps the fields of the common decoder families (Llama, Mistral,
Qwen2/2.5, Qwen3, Qwen3-MoE, Mixtral, gpt-oss, Gemma 3, OLMo 2, DeepSeek-V2/V3), the hybrid linear-attention ones
(Qwen3-Next, Qwen3.5: Gated DeltaNet layers, gated full attention every N layers, MTP
layers) and the Qwen-VL vision-language ones (a vision tower's parameters from its
``vision_config``) onto the catalog's fields;
``add_model`` writes it into the user's ``models.yaml`` (``rpeg specs add-model``). Every
field it cannot find is reported at once (SpecError).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rpeg.errors import Problem
from rpeg.specs._load import SpecError, user_specs_dir
from rpeg.specs.models import MODEL_KINDS, parse_models

# model_type -> (family, qkv bias, q/k norm)
_FAMILIES = {
    "llama": ("llama", False, False),
    "mistral": ("llama", False, False),
    "mixtral": ("llama", False, False),
    "qwen2": ("qwen2", True, False),
    "qwen2_moe": ("qwen2", True, False),
    "qwen3": ("qwen3", False, True),
    "qwen3_moe": ("qwen3", False, True),
    "gemma3_text": ("gemma3", False, True),
    "olmo2": ("olmo2", False, True),
    "gpt_oss": ("gpt-oss", True, False),
    "deepseek_v2": ("deepseek", False, False),
    "deepseek_v3": ("deepseek", False, False),
    # hybrid Gated DeltaNet + gated attention (linear layers, a full layer every N)
    "qwen3_next": ("qwen3-next", False, True),
    "qwen3_5": ("qwen3.5", False, True),
    "qwen3_5_text": ("qwen3.5", False, True),
    "qwen3_5_moe": ("qwen3.5", False, True),
    "qwen3_5_moe_text": ("qwen3.5", False, True),
    # vision-language: the LM fields sit at the top (Qwen2-VL/2.5-VL) or in text_config
    "qwen2_vl": ("qwen2", True, False),
    "qwen2_5_vl": ("qwen2", True, False),
    "qwen3_vl": ("qwen3", False, True),
    "qwen3_vl_moe": ("qwen3", False, True),
}
#: families whose full-attention layers gate their output (a second query-sized projection)
_GATED = ("qwen3-next", "qwen3.5")


def _qwen3_vl_vision_params(v: dict[str, Any], lm_hidden: int) -> tuple[int, int]:
    """(parameters, ViT patches per LM token) of a Qwen3-VL vision tower (transformers'
    modeling_qwen3_vl): a Conv3d patch embedding with bias, a learned position embedding
    (``num_position_embeddings`` x h), ``depth`` blocks of [two LayerNorms, qkv + proj with
    biases, an fc1/fc2 MLP with biases], the merger (LayerNorm(h), then m^2 h -> m^2 h -> LM
    width with biases) and one more merger per ``deepstack_visual_indexes`` entry whose
    LayerNorm is on the m^2 h shuffled width. Checked: Qwen3-VL-8B's tower 576,388,336."""
    h = int(v.get("hidden_size") or 0)
    depth = int(v.get("depth") or 0)
    f = int(v.get("intermediate_size") or 4 * h)
    block = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    patch = int(v.get("patch_size") or 16)
    chans = int(v.get("in_channels") or v.get("in_chans") or 3)
    embed = chans * int(v.get("temporal_patch_size") or 2) * patch * patch * h + h
    pos = int(v.get("num_position_embeddings") or 0) * h
    m = int(v.get("spatial_merge_size") or 2)
    out = int(v.get("out_hidden_size") or lm_hidden)
    wide = m * m * h
    mlp = wide * wide + wide + wide * out + out
    deepstack = len(v.get("deepstack_visual_indexes") or ())
    return depth * block + embed + pos + (2 * h + mlp) + deepstack * (2 * wide + mlp), m * m


def _vision_params(v: dict[str, Any], lm_hidden: int) -> tuple[int, int]:
    """(parameters, ViT patches per LM token) of a Qwen-VL-style vision tower (Qwen3-VL's
    layout when the config has its deepstack or position-embedding fields: ``depth``
    blocks of attention (qkv + proj with biases, 4h^2) and an MLP (SwiGLU 3hf for
    ``silu``, else 2hf), the patch embedding (channels x temporal x patch^2 x h), and the
    patch merger (LayerNorm'd MLP from m^2 h to m^2 h to the LM width)."""
    if "deepstack_visual_indexes" in v or "num_position_embeddings" in v:
        return _qwen3_vl_vision_params(v, lm_hidden)
    h = int(v.get("hidden_size") or v.get("embed_dim") or 0)
    depth = int(v.get("depth") or v.get("num_hidden_layers") or 0)
    f = int(v.get("intermediate_size") or h * float(v.get("mlp_ratio") or 4))
    mlp = (3 if str(v.get("hidden_act", "")).startswith("silu") else 2) * h * f
    block = 4 * h * h + 4 * h + mlp + 4 * h  # attention + biases + MLP + 2 norms
    patch = int(v.get("patch_size") or 14)
    embed = int(v.get("in_chans") or v.get("in_channels") or 3)
    embed *= int(v.get("temporal_patch_size") or 1) * patch * patch * h
    m = int(v.get("spatial_merge_size") or 2)
    out = int(v.get("out_hidden_size") or lm_hidden)
    merger = (m * m * h) * (m * m * h) + (m * m * h) * out
    return depth * block + embed + merger, m * m


def entry_from_hf(cfg: dict[str, Any], *, kind: str = "instruct", source: str = "") -> dict:
    """The catalog entry (models.yaml mapping) of an HF decoder config."""
    problems: list[Problem] = []
    vision_cfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else None
    if isinstance(cfg.get("text_config"), dict):
        # multimodal and hybrid checkpoints nest the LM's fields; the top names the family
        top_type = cfg.get("model_type", "")
        cfg = {**cfg, **cfg["text_config"]}
        cfg["model_type"] = top_type if top_type in _FAMILIES else cfg.get("model_type", "")
    mt = cfg.get("model_type", "")
    if mt not in _FAMILIES:
        problems.append(
            Problem("model_type", f"got {mt!r}; supported: {', '.join(sorted(_FAMILIES))}")
        )
    if kind not in MODEL_KINDS:
        problems.append(Problem("kind", f"got {kind!r}; allowed: {', '.join(MODEL_KINDS)}"))

    def req(key: str, *alts: str) -> Any:
        for k in (key, *alts):
            if cfg.get(k) is not None:
                return cfg[k]
        problems.append(Problem(key, "missing in config.json"))
        return 0

    family, bias, qk_norm = _FAMILIES.get(mt, ("", False, False))
    hidden = req("hidden_size")
    heads = req("num_attention_heads")
    e: dict[str, Any] = {
        "kind": kind,
        "family": family,
        "layers": req("num_hidden_layers"),
        "hidden": hidden,
        "ffn_hidden": req("intermediate_size"),
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or (hidden // heads if heads else 0),
        "vocab": req("vocab_size"),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "qkv_bias": bool(cfg.get("attention_bias", bias)),
        "qk_norm": qk_norm,
    }
    if cfg.get("max_position_embeddings"):
        e["max_position"] = int(cfg["max_position_embeddings"])
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    if experts:
        moe: dict[str, Any] = {
            "experts": int(experts),
            "top_k": int(req("num_experts_per_tok")),
            "expert_ffn_hidden": int(cfg.get("moe_intermediate_size") or e["ffn_hidden"]),
        }
        shared = cfg.get("n_shared_experts") or (
            1 if cfg.get("shared_expert_intermediate_size") else 0
        )
        if shared:
            moe["shared_experts"] = int(shared)
        if cfg.get("first_k_dense_replace"):
            moe["first_dense_layers"] = int(cfg["first_k_dense_replace"])
        e["moe"] = moe
    if cfg.get("kv_lora_rank"):
        e["mla"] = {
            "q_lora_rank": int(req("q_lora_rank")),
            "kv_lora_rank": int(cfg["kv_lora_rank"]),
            "qk_nope_dim": int(req("qk_nope_head_dim")),
            "qk_rope_dim": int(req("qk_rope_head_dim")),
            "v_head_dim": int(req("v_head_dim")),
        }
        e["head_dim"] = e["mla"]["qk_nope_dim"] + e["mla"]["qk_rope_dim"]
        e["kv_heads"] = heads
    if cfg.get("linear_num_value_heads"):
        layers = int(e["layers"] or 0)
        types = cfg.get("layer_types") or []
        full = sum(1 for t in types if t == "full_attention")
        interval = cfg.get("full_attention_interval") or (layers // full if full else 0)
        if not interval:
            problems.append(Problem("full_attention_interval", "missing (nor layer_types)"))
        e["linear_attn"] = {
            "full_attention_interval": int(interval or 1),
            "key_heads": int(req("linear_num_key_heads")),
            "value_heads": int(req("linear_num_value_heads")),
            "key_head_dim": int(req("linear_key_head_dim")),
            "value_head_dim": int(req("linear_value_head_dim")),
            "conv_kernel": int(cfg.get("linear_conv_kernel_dim") or 4),
        }
    if family in _GATED and cfg.get("attn_output_gate", True):
        e["gated_attention"] = True
    mtp = cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers")
    if mtp:
        e["mtp_layers"] = int(mtp)
    if vision_cfg:
        from rpeg.specs.models import rl_image_tokens

        params, merge = _vision_params(vision_cfg, int(hidden or 0))
        # one image at the RL frameworks' pixel floor, in this tower's LM tokens
        side = int(vision_cfg.get("patch_size") or 14) * int(
            vision_cfg.get("spatial_merge_size") or 2
        )
        e["vision"] = {
            "params": int(params),
            "patch_merge": merge,
            "image_tokens": rl_image_tokens(side),
        }
    if source:
        e["source"] = source
    if problems:
        raise SpecError(problems, title="config.json cannot be read as a catalog model")
    return e


def add_model(
    config_path: Path, name: str, *, kind: str = "instruct", out: Path | None = None
) -> tuple[Path, dict]:
    """Write the model of ``config_path`` into the user catalog (``models.yaml``) as ``name``;
    the entry is validated by the catalog loader before the file is written."""
    try:
        cfg = json.loads(Path(config_path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecError([Problem(str(config_path), f"not a readable JSON file: {exc}")]) from None
    if not isinstance(cfg, dict):
        raise SpecError([Problem(str(config_path), "top level must be a JSON object")])
    entry = entry_from_hf(cfg, kind=kind, source=f"added from {Path(config_path).name}")
    parse_models([({"models": {name: entry}}, str(config_path))])  # every problem at once
    path = out or user_specs_dir() / "models.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    data = data if isinstance(data, dict) else {}
    data.setdefault("models", {})[name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, entry


def _add_hint(path: str, readable: bool) -> str:
    """How to give planning the model's shape when ``path``'s config.json does not."""
    same = "or set model.name to a catalog model of the same shape (`rpeg specs list`)"
    if readable:  # a family this reader does not know: add-model would refuse it too
        return (
            f"describe it in {user_specs_dir() / 'models.yaml'} (fields as the shipped entries: "
            f"layers, hidden, ffn_hidden, heads, kv_heads, head_dim, vocab) and set model.name "
            f"to its name, {same}"
        )
    cfg = f"{path.rstrip('/')}/config.json"
    return f"add it with `rpeg specs add-model --from-hf {cfg} --name NAME` and set model.name: NAME, {same}"


def read_hf_config(path: str) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face model folder ``path`` (a local path or an
    fsspec URL), as a dict; a SpecError naming ``model.path`` when it cannot be read."""
    import fsspec

    url = f"{str(path).rstrip('/')}/config.json"
    try:
        with fsspec.open(url, "r") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as exc:
        raise SpecError(
            [
                Problem(
                    "model.path",
                    f"{url!r} cannot be read ({type(exc).__name__}: {exc}); "
                    f"{_add_hint(str(path), readable=False)}",
                )
            ],
            title="the model cannot be priced",
        ) from None
    if not isinstance(cfg, dict):
        raise SpecError(
            [Problem("model.path", f"{url!r}: top level must be a JSON object")],
            title="the model cannot be priced",
        )
    return cfg


def model_from_folder(path: str, *, kind: str = "instruct") -> Any:
    """The catalog spec (:class:`rpeg.specs.models.ModelSpec`) of the model in the Hugging Face
    folder ``path``, read from its ``config.json`` and named after the folder. A model the
    reader does not know is refused, naming how to add it to the catalog."""
    cfg = read_hf_config(path)
    name = str(path).rstrip("/").rsplit("/", 1)[-1] or "model"
    try:
        entry = entry_from_hf(cfg, kind=kind, source=f"read from {path}/config.json")
        return parse_models([({"models": {name: entry}}, str(path))])[name]
    except SpecError as exc:
        why = "; ".join(str(p) for p in exc.problems)
        raise SpecError(
            [Problem("model.path", f"{path!r} cannot be priced ({why}); {_add_hint(path, True)}")],
            title="the model cannot be priced",
        ) from None


def prices_folder(model: Any) -> bool:
    """Whether planning prices the folder of ``model.path`` (``model``: the run config's
    model section): a path is set and ``model.name`` is left at its default (the built-in
    tiny model's catalog name, which is not the model in the folder). A catalog
    ``model.name`` set beside a path is the user's word for the shape."""
    if not getattr(model, "path", None):
        return False
    fields = getattr(type(model), "model_fields", {})
    default = fields["name"].default if "name" in fields else None
    return model.name == default


#: the built-in model's catalog name, and its ``model.tiny_shape`` keys (Hugging Face config
#: names) -> catalog field names
TINY_NAME = "rpeg-tiny"
_TINY_KEYS = {
    "vocab_size": "vocab",
    "hidden_size": "hidden",
    "intermediate_size": "ffn_hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "max_position_embeddings": "max_position",
}


def tiny_model(shape: dict[str, int] | None) -> Any:
    """The ModelSpec of the built-in model widened by ``model.tiny_shape`` (``shape``: its
    overrides; none: the catalog's ``rpeg-tiny``), named by its shape (``rpeg-tiny-h1536-l8``)
    and made known by that name in this process. What the runtime builds is what is
    priced: a 302M-parameter ``tiny_shape`` is not planned as the 4M-parameter default."""
    from dataclasses import replace

    from rpeg import specs

    base = specs.model(TINY_NAME)
    if not shape:
        return base
    upd = {_TINY_KEYS[k]: int(v) for k, v in shape.items() if k in _TINY_KEYS}
    hidden = upd.get("hidden", base.hidden)
    heads = upd.get("heads", base.heads)
    if "heads" in upd and "kv_heads" not in upd:
        upd["kv_heads"] = heads
    upd["head_dim"] = hidden // heads if heads else base.head_dim
    spec = replace(base, **upd)
    name = f"{TINY_NAME}-h{spec.hidden}-l{spec.layers}-f{spec.ffn_hidden}-a{spec.heads}x{spec.kv_heads}"
    spec = replace(spec, name=name)
    specs.add_run_model(spec)
    return spec


def priced_model(model: Any, catalog: Any = None) -> Any:
    """The ModelSpec the performance model prices for a run's ``model`` section: the folder's
    ``config.json`` when :func:`prices_folder`, else the catalog entry of ``model.name``
    (``catalog``: a name -> spec lookup, default the catalog's exact names). The folder's
    spec is also made known by name in this process (:func:`rpeg.specs.add_run_model`)."""
    from rpeg import specs

    if prices_folder(model):
        spec = model_from_folder(model.path)
        specs.add_run_model(spec)  # plans name it: pricing them finds this spec
        return spec
    shaped = not getattr(model, "path", None) and getattr(model, "tiny_shape", None)
    if shaped and model.name == TINY_NAME:
        return tiny_model(model.tiny_shape)
    return (catalog or specs.model)(model.name)
