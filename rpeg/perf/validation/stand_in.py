"""A model the catalog lacks, priced by the architecture its name's size points at (pure).

A published row may name a checkpoint the catalog does not hold. When the name states its
size (``Acme-6.7B``, ``Foo-30B-A3B``, ``Bar-1T-A32B``) the row is priced by a stand-in: the
nearest cataloged architecture resized to that size (:func:`stand_in`), listed among the
row's priors, its range widened by the architecture's spread (rpeg.perf.interval,
``ARCH_FACTOR``; measured by benchmarks/bench_stand_in.py). Names are read as
:mod:`rpeg.perf.validation.model_words` reads them; docs/validation.md, "Models the catalog
lacks".
"""

from __future__ import annotations

import math
import re

from rpeg.perf.validation.model_words import SUFFIX_KIND, VENDORS, catalog_key, compact_name

#: a name's size word: parameters (6.7b, 350m, 1t; BLOOM's 7b1 = 7.1b, 1b7 = 1.7b: a whole
#: number, the unit, one decimal digit), an MoE's active parameters (a3b)
_PARAMS = re.compile(r"^(\d+(?:\.\d+)?)([bmt])$|^(\d+)([bmt])(\d)$")
_UNIT = {"m": 1e6, "b": 1e9, "t": 1e12}
_ACTIVE = re.compile(r"^a(\d+(?:\.\d+)?)b$")
#: size words that leave an MoE's total unsaid (8x22b, 16e): no stand-in
_EXPERTS = re.compile(r"^(?:\d+x\d+(?:\.\d+)?[bm]|\d+e)$")
#: words of a reasoning checkpoint's name (R1-distilled, thinking, QwQ)
_REASONING_WORDS = frozenset({"r1", "reasoning", "reasoner", "think", "thinking", "qwq"})


def _size(m: re.Match) -> float:
    """Parameters of a size word: ``6.7b``, or BLOOM's ``7b1`` (the digit after the unit is
    the first decimal: 7.1 B)."""
    if m.group(1) is not None:
        return float(m.group(1)) * _UNIT[m.group(2)]
    return float(f"{m.group(3)}.{m.group(5)}") * _UNIT[m.group(4)]


#: words of a vision-language checkpoint's name: these whole words (Qwen2.5-Omni, MiniCPM-V's
#: lone "v"), a word ending in ``vl`` / ``vlm`` (Qwen2.5-VL, SmolVLM, DeepSeek-VL2), starting
#: with a VL family's name (InternVL, LLaVA, Idefics, Ovis) or a version ending in ``v``
#: (GLM-4.1V, Skywork-R1V)
_VISION_WORDS = frozenset({"vision", "omni", "v", "vlm"})
_VL_END = re.compile(r"vlm?\d*$")
_VISION_VERSION = re.compile(r"^(?:\d+(?:\.\d+)?|r\d+)v$")


def vision_word(w: str) -> bool:
    """Whether a word of a catalog key names a vision-language checkpoint."""
    return (
        w in _VISION_WORDS
        or bool(_VL_END.search(w))
        or w.startswith(("internvl", "llava", "idefics", "ovis"))
        or bool(_VISION_VERSION.match(w))
    )


def vision_name(name: str) -> bool:
    """Whether a checkpoint's name says it is a vision-language model (:func:`vision_word`)."""
    return any(vision_word(w) for w in catalog_key(name).split("-"))


def stated_kind(name: str) -> str | None:
    """What a checkpoint's name says it emits: a kind suffix (-Instruct, -Base, -chat, -it,
    -Thinking) or a reasoning word anywhere (R1, Reasoning, Think, QwQ); None when silent."""
    words = catalog_key(name).split("-")
    for w in reversed(words):
        if w in SUFFIX_KIND:
            return SUFFIX_KIND[w]
    if _REASONING_WORDS.intersection(words):
        return "reasoning"
    return None


def stand_in(name: str, catalog: dict | None = None):  # -> ModelSpec | None
    """The architecture that prices a model the catalog lacks, when its name states its size
    (``Acme-6.7B``, ``Foo-30B-A3B``; a vision-language name -- ``-VL``, ``Vision``,
    ``InternVL`` -- among the entries with a vision tower):

    1. the entries of the name's family within a factor 2 of its size -- catalog names that
       start with the name's first word (``Qwen2.5-Foo-72B`` -> qwen2.5-*) -- else every entry;
       of these, those with grouped-query or latent attention (the KV cache of a current model: a
       long-generation step is bound by it, and full multi-head attention is the old
       exception, OPT, Llama-2), of the same kind (dense, or an MoE when the name gives
       its active size ``-A3B``);
    2. the one nearest in parameters (in log; an MoE: total plus active);
    3. its depth set so its parameters match the name's size (an MoE: the depth matches the
       active size, the expert count -- a multiple of 8 -- the total).

    Renamed ``<name> (as <entry>)``; its kind is what the name says (:func:`stated_kind`),
    else instruct. None when the name states no size, several, or an MoE without its total
    (``8x22B``, ``17B-16E``): such a row stays refused with the command that adds the model.
    The row lists ``model`` among its priors and its range takes the architecture's spread
    (rpeg.perf.interval, ``architecture``). ``catalog``: the entries to choose from (default:
    the catalog; benchmarks/bench_stand_in.py leaves a row's own shape out)."""
    from dataclasses import replace

    from rpeg import specs

    key = catalog_key(name)
    for vendor in VENDORS:
        key = key[len(vendor) :] if key.startswith(vendor) else key
    words = key.split("-")
    if not key or any(_EXPERTS.match(w) for w in words):
        return None
    totals = [_size(m) for m in map(_PARAMS.match, words) if m]
    actives = [float(m.group(1)) * 1e9 for m in map(_ACTIVE.match, words) if m]
    if len(totals) != 1 or len(actives) > 1 or (actives and actives[0] >= totals[0]):
        return None
    total, active = totals[0], (actives[0] if actives else None)
    vision = any(vision_word(w) for w in words)
    pool = [
        m
        for m in (specs.models() if catalog is None else catalog).values()
        if m.family != "rpeg"
        and not m.unsupported
        and m.linear_attn is None
        and (m.moe is not None) == (active is not None)
        and (m.vision is not None) == vision
    ]
    head = compact_name(words[0])
    family = [
        m
        for m in pool
        if len(head) >= 3
        and compact_name(m.name).startswith(head)
        and abs(math.log(m.params / total)) <= math.log(2.0)
    ]
    grouped = [m for m in pool if m.mla is not None or m.kv_heads < m.heads]
    pool = [m for m in family if m in grouped] or family or grouped or pool
    if not pool:
        return None

    def distance(m) -> tuple[float, str]:
        d = abs(math.log(m.params / total))
        if active is not None:
            d += abs(math.log(m.active_params / active))
        return d, m.name

    near = min(pool, key=distance)
    first = near.moe.first_dense_layers if near.moe else 0
    depths = [replace(near, layers=n) for n in range(first + 1, 4 * near.layers + 1)]
    if active is None:
        spec = min(depths, key=lambda m: abs(math.log(m.params / total)))
    else:
        spec = min(depths, key=lambda m: abs(math.log(m.active_params / active)))
        moe = spec.moe
        spec = min(
            (
                replace(spec, moe=replace(moe, experts=e))
                for e in range(8, 4 * moe.experts + 1, 8)
                if e >= moe.top_k
            ),
            key=lambda m: abs(math.log(m.params / total)),
        )
    return replace(
        spec,
        name=f"{key} (as {near.name})",
        kind=stated_kind(name) or "instruct",
        published_params_b=None,
        published_active_params_b=None,
        source=(
            f"stand-in: {near.name}'s architecture at {spec.layers} layers"
            + (f", {spec.moe.experts} experts" if spec.moe else "")
            + ", the catalog's nearest to the name's size"
        ),
    )
