"""Model architecture catalog; parameter counts are derived from the architecture fields."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from rpeg.errors import Problem
from rpeg.specs._load import Checker, SpecError

MODEL_KINDS = ("base", "instruct", "reasoning")


@dataclass(frozen=True)
class MoESpec:
    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    first_dense_layers: int = 0


@dataclass(frozen=True)
class MLASpec:
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class LinearAttnSpec:
    """Hybrid linear attention (Gated DeltaNet, as in Qwen3-Next / Qwen3.5): every
    ``full_attention_interval``-th layer is (gated) full attention with a KV cache; the others
    keep a fixed-size state per sequence (``value_heads`` x ``key_head_dim`` x
    ``value_head_dim``) plus a short causal-conv window, whatever the context length."""

    full_attention_interval: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4


#: pixels of the image an RL recipe feeds a vision model when its data set's images are smaller:
#: the ``min_pixels`` floor of verl's ``process_image`` and EasyR1's data config (512 x 512);
#: the usual RL data sets' images are below it (CLEVR's 480 x 320, Geometry3K's diagrams) and
#: are upscaled to it
RL_IMAGE_PIXELS = 512 * 512


def rl_image_tokens(pixels_per_token: int) -> int:
    """LM tokens of an RL recipe's image (:data:`RL_IMAGE_PIXELS`) for a tower whose LM token
    covers ``pixels_per_token`` pixels a side (ViT patch x spatial merge)."""
    return round(RL_IMAGE_PIXELS / pixels_per_token**2)


@dataclass(frozen=True)
class VisionSpec:
    """A vision tower in front of the LM (ViT + patch merger, as in Qwen2.5-VL): its
    parameters, the ViT patches behind one LM image token (2x2 spatial merge = 4), and the
    LM image tokens per sample assumed when a workload does not state them (one image at the
    RL frameworks' pixel floor: 334 for Qwen2/2.5-VL's 28-pixel LM tokens, 14-pixel patches
    merged 2x2)."""

    params: int
    patch_merge: int = 4
    image_tokens: int = rl_image_tokens(28)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    max_position: int = 0
    # What the model was trained to emit, which sets the prior of its response lengths when
    # a workload does not state them (rpeg.perf.lengths): "reasoning" (long chain of thought:
    # R1-distilled, Qwen3 thinking), "instruct" or "base" (short answers).
    kind: str = "instruct"
    published_params_b: float | None = None
    published_active_params_b: float | None = None
    unsupported: str = ""
    source: str = ""
    linear_attn: LinearAttnSpec | None = None
    # full-attention layers gate their output with a sigmoid of a second query-sized
    # projection (Qwen3-Next "gated attention"): q projection twice as wide
    gated_attention: bool = False
    vision: VisionSpec | None = None
    # multi-token-prediction layers (DeepSeek-V3, Qwen3-Next): not part of ``params``; RL
    # recipes train without them; an engine may use them to draft speculative tokens
    mtp_layers: int = 0

    # --- per-layer parameter counts ---------------------------------------------------
    @cached_property
    def attn_params(self) -> int:
        h = self.hidden
        if self.mla:
            m = self.mla
            qk = m.qk_nope_dim + m.qk_rope_dim
            return (
                h * m.q_lora_rank
                + m.q_lora_rank  # q down-proj + norm
                + m.q_lora_rank * self.heads * qk  # q up-proj
                + h * (m.kv_lora_rank + m.qk_rope_dim)
                + m.kv_lora_rank  # kv down + norm
                + m.kv_lora_rank * self.heads * (m.qk_nope_dim + m.v_head_dim)  # kv up
                + self.heads * m.v_head_dim * h  # output
            )
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        p = h * q + 2 * h * kv + q * h
        if self.gated_attention:
            p += h * q  # the output gate's projection
        if self.qkv_bias:
            p += q + 2 * kv
        if self.qk_norm:
            p += 2 * self.head_dim
        return p

    @property
    def full_attn_layers(self) -> int:
        """Layers with softmax attention over the whole context (a KV cache)."""
        if self.linear_attn is None:
            return self.layers
        return self.layers // self.linear_attn.full_attention_interval

    @property
    def linear_layers(self) -> int:
        return self.layers - self.full_attn_layers

    @cached_property
    def linear_attn_params(self) -> int:
        """One Gated DeltaNet layer: q/k/v/z and b/a input projections, causal conv over
        q/k/v, per-head decay (A_log, dt_bias), gated norm, output projection."""
        la = self.linear_attn
        if la is None:
            return 0
        qk = la.key_heads * la.key_head_dim
        v = la.value_heads * la.value_head_dim
        h = self.hidden
        return (
            h * (2 * qk + 2 * v)  # in_proj_qkvz
            + h * 2 * la.value_heads  # in_proj_ba
            + (2 * qk + v) * la.conv_kernel  # depthwise conv1d
            + 2 * la.value_heads  # A_log, dt_bias
            + la.value_head_dim  # gated RMSNorm
            + v * h  # out_proj
        )

    @property
    def linear_flops_per_token(self) -> float:
        """Recurrent-state FLOPs per token of all linear layers (delta-rule update of the
        key x value state and its readout: ~3 state-sized multiply-adds per head)."""
        la = self.linear_attn
        if la is None:
            return 0.0
        return self.linear_layers * 6.0 * la.value_heads * la.key_head_dim * la.value_head_dim

    def linear_state_bytes(self, bytes_per_value: float = 2.0) -> float:
        """Fixed per-sequence state of all linear layers (recurrent state + conv window)."""
        la = self.linear_attn
        if la is None:
            return 0.0
        state = la.value_heads * la.key_head_dim * la.value_head_dim
        conv = (2 * la.key_heads * la.key_head_dim + la.value_heads * la.value_head_dim) * (
            la.conv_kernel - 1
        )
        return self.linear_layers * (state + conv) * bytes_per_value

    @cached_property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.ffn_hidden

    @cached_property
    def expert_params(self) -> int:
        """One routed expert (SwiGLU)."""
        return 3 * self.hidden * self.moe.expert_ffn_hidden if self.moe else 0

    @property
    def routed_expert_params(self) -> int:
        """Parameters of every routed expert of every MoE layer (0 for a dense model)."""
        return self.moe_layers * self.moe.experts * self.expert_params if self.moe else 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.moe.first_dense_layers if self.moe else 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def _mlp_params(self, active: bool) -> int:
        total = self.dense_layers * self.dense_mlp_params
        if self.moe:
            m = self.moe
            per = (m.top_k if active else m.experts) + m.shared_experts
            total += self.moe_layers * (per * self.expert_params + self.hidden * m.experts)
        return total

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @cached_property
    def mixer_params(self) -> int:
        """Attention (and linear-attention) parameters of all layers."""
        return (
            self.full_attn_layers * self.attn_params + self.linear_layers * self.linear_attn_params
        )

    @property
    def vision_params(self) -> int:
        return self.vision.params if self.vision else 0

    @cached_property
    def params(self) -> int:
        """Total parameters (embeddings and vision tower included, MTP excluded)."""
        norms = self.layers * 2 * self.hidden + self.hidden
        return (
            self.embedding_params
            + self.mixer_params
            + self._mlp_params(False)
            + norms
            + self.vision_params
        )

    @cached_property
    def active_params(self) -> int:
        """Parameters touched per token (top-k routed + shared experts; vision included)."""
        norms = self.layers * 2 * self.hidden + self.hidden
        return (
            self.embedding_params
            + self.mixer_params
            + self._mlp_params(True)
            + norms
            + self.vision_params
        )

    @cached_property
    def matmul_params(self) -> int:
        """Matmul work per LM token in parameter units (2 FLOPs each): the active LM
        parameters (the input lookup table and the vision tower excluded: the tower runs
        per image patch, rpeg.perf.units) plus the linear layers' state FLOPs / 2."""
        lookup = 0 if self.tied_embeddings else self.vocab * self.hidden
        return int(
            self.active_params - lookup - self.vision_params + self.linear_flops_per_token / 2
        )

    @property
    def attn_width(self) -> int:
        """heads x (q/k head dim): the width of QK^T; AV uses v_head_dim for MLA."""
        return self.heads * self.head_dim

    @property
    def v_width(self) -> int:
        return self.heads * (self.mla.v_head_dim if self.mla else self.head_dim)

    def kv_bytes_per_token(self, bytes_per_value: float = 2.0) -> float:
        """KV-cache bytes one token adds across all layers (MLA caches the latent + rope key)."""
        if self.mla:
            per_layer = self.mla.kv_lora_rank + self.mla.qk_rope_dim
        else:
            per_layer = 2 * self.kv_heads * self.head_dim
        return self.full_attn_layers * per_layer * bytes_per_value

    @cached_property
    def hf_tensors(self) -> int:
        """Weight tensors of the HuggingFace checkpoint layout (what a weight refit converts and
        hands over one by one): embeddings, final norm, untied LM head; per layer the attention
        projections (GQA q,k,v,o + biases + q/k norms; MLA q_a, q_a_norm, q_b, kv_a, kv_a_norm,
        kv_b, o), 2 norms and the MLP (dense gate/up/down; MoE 3 per routed and shared expert
        plus the router)."""
        if self.mla:
            attn = 7
        else:
            attn = 4 + (3 if self.qkv_bias else 0) + (2 if self.qk_norm else 0)
        per_layer = attn + 2
        n = 2 + (0 if self.tied_embeddings else 1) + self.layers * per_layer
        n += self.dense_layers * 3
        if self.moe:
            n += self.moe_layers * (3 * (self.moe.experts + self.moe.shared_experts) + 1)
        return n

    def attn_flops_fwd(self, context: float) -> float:
        """Forward attention-score FLOPs for one new token attending to ``context`` tokens
        (QK^T and AV, 2 FLOPs per multiply-add): 2 * L * context * (d_qk + d_v)."""
        return 2.0 * self.full_attn_layers * context * (self.attn_width + self.v_width)


def parse_models(sources: list[tuple[dict[str, Any], str]]) -> dict[str, ModelSpec]:
    problems: list[Problem] = []
    out: dict[str, ModelSpec] = {}
    derived: dict[str, tuple[str, str]] = {}  # name -> (same_as, kind or "")
    derived_src: dict[str, str] = {}
    for data, src in sources:
        top = Checker(src, data, problems)
        ms = top.sub("models", required=src.startswith("rpeg/"))
        top.done()
        if ms is None:
            continue
        for name, entry in ms.data.items():
            c = Checker(f"{src}: models.{name}", entry, problems)
            same = c.text("same_as", default="")
            if same:  # a checkpoint of another entry's architecture (a fine-tune, an RL run)
                derived[name] = (same, c.text("kind", default="", choices=("", *MODEL_KINDS)))
                derived_src[name] = c.text("source", default="")
                out.pop(name, None)  # the last file's entry of a name wins (user over shipped)
                c.done()
                continue
            derived.pop(name, None)
            unsupported = c.text("unsupported", default="")
            req = None if unsupported else ...
            kw: dict[str, Any] = dict(
                family=c.text("family", default=""),
                layers=c.num("layers", lo=1, hi=1000, integer=True, default=req or 0),
                hidden=c.num("hidden", lo=8, hi=65536, integer=True, default=req or 0),
                ffn_hidden=c.num("ffn_hidden", lo=8, hi=262144, integer=True, default=req or 0),
                heads=c.num("heads", lo=1, hi=1024, integer=True, default=req or 0),
                kv_heads=c.num("kv_heads", lo=1, hi=1024, integer=True, default=req or 0),
                head_dim=c.num("head_dim", lo=8, hi=1024, integer=True, default=req or 0),
                vocab=c.num("vocab", lo=2, hi=2_000_000, integer=True, default=req or 0),
                tied_embeddings=c.flag("tied_embeddings"),
                qkv_bias=c.flag("qkv_bias"),
                qk_norm=c.flag("qk_norm"),
                max_position=c.num("max_position", lo=1, hi=10_000_000, integer=True, default=0),
                kind=c.text("kind", default="instruct", choices=MODEL_KINDS),
                published_params_b=c.num("published_params_b", lo=0, hi=100000, default=None),
                published_active_params_b=c.num(
                    "published_active_params_b", lo=0, hi=100000, default=None
                ),
                unsupported=unsupported,
                source=c.text("source", default=""),
            )
            moe = c.sub("moe")
            if moe:
                kw["moe"] = MoESpec(
                    experts=moe.num("experts", lo=1, hi=4096, integer=True),
                    top_k=moe.num("top_k", lo=1, hi=64, integer=True),
                    expert_ffn_hidden=moe.num("expert_ffn_hidden", lo=1, hi=65536, integer=True),
                    shared_experts=moe.num("shared_experts", lo=0, hi=64, integer=True, default=0),
                    first_dense_layers=moe.num(
                        "first_dense_layers", lo=0, hi=1000, integer=True, default=0
                    ),
                )
                moe.done()
                if kw["moe"].top_k > kw["moe"].experts:
                    problems.append(Problem(f"{moe.where}.top_k", "must be <= experts"))
            la = c.sub("linear_attn")
            if la:
                kw["linear_attn"] = LinearAttnSpec(
                    full_attention_interval=la.num(
                        "full_attention_interval", lo=1, hi=1000, integer=True
                    ),
                    key_heads=la.num("key_heads", lo=1, hi=1024, integer=True),
                    value_heads=la.num("value_heads", lo=1, hi=1024, integer=True),
                    key_head_dim=la.num("key_head_dim", lo=1, hi=4096, integer=True),
                    value_head_dim=la.num("value_head_dim", lo=1, hi=4096, integer=True),
                    conv_kernel=la.num("conv_kernel", lo=1, hi=64, integer=True, default=4),
                )
                la.done()
            vis = c.sub("vision")
            if vis:
                kw["vision"] = VisionSpec(
                    params=vis.num("params", lo=1, hi=10**12, integer=True),
                    patch_merge=vis.num("patch_merge", lo=1, hi=64, integer=True, default=4),
                    image_tokens=vis.num(
                        "image_tokens", lo=0, hi=10**6, integer=True, default=rl_image_tokens(28)
                    ),
                )
                vis.done()
            kw["gated_attention"] = c.flag("gated_attention")
            kw["mtp_layers"] = c.num("mtp_layers", lo=0, hi=64, integer=True, default=0)
            mla = c.sub("mla")
            if mla:
                kw["mla"] = MLASpec(
                    q_lora_rank=mla.num("q_lora_rank", lo=1, hi=65536, integer=True),
                    kv_lora_rank=mla.num("kv_lora_rank", lo=1, hi=65536, integer=True),
                    qk_nope_dim=mla.num("qk_nope_dim", lo=1, hi=1024, integer=True),
                    qk_rope_dim=mla.num("qk_rope_dim", lo=1, hi=1024, integer=True),
                    v_head_dim=mla.num("v_head_dim", lo=1, hi=1024, integer=True),
                )
                mla.done()
            c.done()
            if not unsupported and kw["heads"] and kw["kv_heads"] and kw["heads"] % kw["kv_heads"]:
                problems.append(
                    Problem(
                        f"{c.where}.kv_heads", f"{kw['kv_heads']} must divide heads={kw['heads']}"
                    )
                )
            out[name] = ModelSpec(name=name, **kw)
    for name, (same, kind) in derived.items():
        base = out.get(same)
        if base is None or same in derived:
            problems.append(
                Problem(
                    f"models.{name}.same_as", f"{same!r} is no architecture entry of the catalog"
                )
            )
            continue
        out[name] = replace(
            base,
            name=name,
            kind=kind or base.kind,
            published_params_b=None,
            published_active_params_b=None,
            source=derived_src[name] or f"same architecture as {same}",
        )
    if problems:
        raise SpecError(problems, title="invalid model catalog")
    return out


def format_params(n: float) -> str:
    """A parameter count in the unit that shows it: 350 K, 7.6 M, 1.54 B, 671 B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f}"
