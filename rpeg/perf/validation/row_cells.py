"""Reading a published-run CSV row's cells (pure): numbers with annotations, yes/no and
staleness cells, and the catalog model, GPU and cluster a row names (aliases, organisation
prefixes, checkpoint suffixes). A cell the model cannot read raises :class:`Unpredictable`
naming the column and value. What a row describes: :mod:`rpeg.perf.validation.rows`."""

from __future__ import annotations

import math
import re

from rpeg.perf.validation.model_words import SUFFIX_KIND, VENDORS, catalog_key, compact_name
from rpeg.perf.validation.stand_in import stand_in, stated_kind, vision_name


class Unpredictable(ValueError):
    """A row the model cannot price honestly; the message says why."""


def one_line(exc: Exception) -> str:
    """A validation error's messages on one line (pydantic prints one per line)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join(str(e.get("msg", e)) for e in errors())
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return " ".join(str(exc).split())


# The catalog cluster a row's GPU runs in by default; a row whose `gpus_per_node` differs
# is priced on a catalog cluster of that GPU with that node size (see ``cluster_for``).
_CLUSTER_FOR_GPU = {
    "h100-sxm": "dgx-h100",
    "h200": "dgx-h200",
    "h800": "h800-cluster",
    "h20": "h20-cluster",
    "gb200": "gb200-nvl72",
    "gh200": "gh200-alps",
    "gh200-144g": "gh200-144g-quad",
    "a100-80g": "dgx-a100",
    "a100-40g": "dgx-a100-40g",
    "a800": "a800-cluster",
    "b200": "dgx-b200",
    "mi300x": "mi300x-cluster",
    "v100-32g": "dgx1-v100",
    "v100-16g": "dgx1-v100-16g",
    "v100-pcie": "v100-pcie-cluster",
    "v100-pcie-16g": "v100-pcie-16g-cluster",
    "v100s": "v100s-cluster",
    "a10": "a10-cluster",
    "a10g": "aws-g5",
    "a30": "a30-cluster",
    "l4": "l4-cluster",
    "t4": "t4-cluster",
    "mi250x": "frontier-mi250x",
    "mi250": "mi250-cluster",
    "rtx-3090": "rtx3090-cluster",
    "rtx-5090": "rtx5090-cluster",
    "a100-pcie-40g": "a100-pcie-40g-cluster",
    "cpu": "local-cpu",
}


def cluster_for(gpu: str, gpus_per_node: int | None) -> str:
    """Catalog cluster of ``gpu`` with ``gpus_per_node`` GPUs per node (the default cluster
    when the row does not say); Unpredictable naming what is missing otherwise."""
    from rpeg import specs

    default = _CLUSTER_FOR_GPU.get(gpu)
    candidates = [n for n, c in sorted(specs.clusters().items()) if c.gpu.name == gpu]
    if default in candidates:
        candidates.remove(default)
        candidates.insert(0, default)
    if not candidates:
        raise Unpredictable(f"no catalog cluster of {gpu} GPUs (add one to clusters.yaml)")
    if gpus_per_node is None:
        return candidates[0]
    for name in candidates:
        if specs.cluster(name).gpus_per_node == gpus_per_node:
            return name
    # a node size the catalog lacks: the default cluster's links with that many GPUs a node
    # (the row lists it as assumed: rpeg.perf.validation.rows)
    try:
        derived = specs.cluster(candidates[0]).with_node_size(gpus_per_node)
    except ValueError as exc:
        raise Unpredictable(f"gpus_per_node: {exc}") from None
    specs.add_run_cluster(derived)
    return derived.name


def derived_cluster(name: str) -> bool:
    """Whether ``name`` is a cluster derived for a row's node size (not in the catalog)."""
    from rpeg import specs

    return name not in specs.clusters()


# Names a data set may use for a catalog GPU (lower-cased, spaces as dashes).
GPU_ALIASES = {
    "h100": "h100-sxm",
    "h100-80g": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "a100": "a100-80g",
    "a100-80gb": "a100-80g",
    "a100-40gb": "a100-40g",
    "a800-80g": "a800",
    "a800-80gb": "a800",
    "h800-80g": "h800",
    "h200-141g": "h200",
    "h200-141gb": "h200",
    "gh200-144gb": "gh200-144g",
    "gh200-96gb": "gh200",
    "mi300": "mi300x",
    "a6000": "rtx-a6000",
    "rtx-6000-ada-generation": "rtx-6000-ada",
    "6000-ada": "rtx-6000-ada",
    # Huawei's NPU as published runs name it (verl / MindSpeed-RL: "Ascend 910B", "910B3",
    # "Atlas 800T A2")
    "910b": "ascend-910b",
    "910b2": "ascend-910b",
    "910b3": "ascend-910b",
    "ascend910b": "ascend-910b",
    "ascend-910b2": "ascend-910b",
    "ascend-910b3": "ascend-910b",
    "atlas-800t-a2": "ascend-910b",
    # its dual-die successor (Atlas A3 servers and the CloudMatrix384 SuperPoD); a catalog
    # device is one die, as the runs count NPUs
    "910c": "ascend-910c",
    "ascend910c": "ascend-910c",
    "atlas-a3": "ascend-910c",
    "atlas-800t-a3": "ascend-910c",
    "atlas-900-a3": "ascend-910c",
    "atlas-900-a3-superpod": "ascend-910c",
    "cloudmatrix384": "ascend-910c",
    # the H20 with 141 GB HBM3e: a size the name states, not the 96 GB h20
    "h20-141gb": "h20-141g",
    "h20-3e": "h20-141g",
    # Volta: a bare "V100" is the SXM2 32 GB part of most published training runs (DGX-1V /
    # DGX-2); the 16 GB and PCIe parts when the name says so
    "v100": "v100-32g",
    "v100-32gb": "v100-32g",
    "v100-16gb": "v100-16g",
    "v100-16g": "v100-16g",
    "v100-pcie-32gb": "v100-pcie",
    "v100-pcie-16gb": "v100-pcie-16g",
    "v100s-pcie": "v100s",
    "a10-pcie": "a10",
    "a30-pcie": "a30",
    "l4-pcie": "l4",
    "a100-pcie-40gb": "a100-pcie-40g",
    "a800-pcie": "a100-pcie",  # the A800 PCIe 80GB is the A100 PCIe 80GB with capped links
    "a800-pcie-80gb": "a100-pcie",
    # AMD CDNA2: one catalog GPU is one GCD (what ROCm and Slurm list)
    "mi250x-gcd": "mi250x",
    "mi250-gcd": "mi250",
    "3090": "rtx-3090",
    "4090": "rtx-4090",
    "4090d": "rtx-4090d",
    "rtx-4090-d": "rtx-4090d",
    # the H800 PCIe is the H100 PCIe with its NVLink bridge capped (the A800 PCIe's pattern)
    "h800-pcie": "h100-pcie",
    "h800-pcie-80gb": "h100-pcie",
    # the RTX 6000 Ada Generation by the name it is often given
    "a6000-ada": "rtx-6000-ada",
    "rtx-a6000-ada": "rtx-6000-ada",
    "5090": "rtx-5090",
}


#: a checkpoint's quantization or weight-format suffix (-FP8, -AWQ, -Int4, -GPTQ-Int8,
#: -FP8-Dynamic): the same architecture
_QUANT = re.compile(
    r"(?:-(?:fp8|fp4|nvfp4|mxfp4|int4|int8|w4a16|w8a8|w4a4|awq|gptq|gguf|bnb-4bit|4bit|8bit)"
    r"(?:-dynamic|-block)?)+$"
)


#: a size token of a model name (8b, 1.5b, a3b, 8x7b): where an architecture's name ends
_SIZE = re.compile(r"^(?:\d+x)?a?\d+(?:\.\d+)?[bm]$")


def resolve_model(name: str) -> tuple[str, str | None]:
    """(catalog model, kind of the checkpoint when the name says it) for a model as written:
    ``Qwen/Qwen2.5-7B-Instruct`` -> qwen2.5-7b-instruct; ``Qwen3-30B-A3B-Base`` -> the
    catalog's qwen3-30b-a3b with kind base; ``Qwen3-4B-Instruct-2507`` -> qwen3-4b,
    instruct; ``Llama-3.1-8B`` and ``Meta-Llama-3.1-8B`` -> llama3.1-8b (a leading vendor word
    dropped: :data:`VENDORS`). A fine-tune named
    after a cataloged architecture and its size (``OpenRLHF/Llama-3-8b-sft-mixture``) takes
    that architecture, kind unsaid; one whose name holds a cataloged base model's name
    (``DeepSeek-R1-0528-Qwen3-8B``) takes that one, with the kind its name says. A name no
    entry matches but that states its size is
    priced by a stand-in (:func:`rpeg.perf.validation.stand_in.stand_in`, registered for this process as
    ``<name> (as <entry>)``); else the name unchanged (refused by :func:`unknown_names`)."""
    found = catalog_match(name)
    if found is not None:
        return found
    spec = stand_in(name)
    if spec is not None:
        from rpeg import specs

        specs.add_run_model(spec)
        return spec.name, stated_kind(name)
    return catalog_key(name), None


def catalog_match(name: str) -> tuple[str, str | None] | None:
    """(catalog model, stated kind) of a name as written when a catalog entry matches it
    (the steps of :func:`resolve_model` before a stand-in), else None: what ``rpeg plan
    --model`` accepts (``Qwen/Qwen2.5-7B-Instruct``, ``Meta-Llama-3.1-8B``)."""
    found = _resolve(catalog_key(name))
    if found is not None:
        return found
    key = catalog_key(name)
    for vendor in VENDORS:  # the vendor in a checkpoint's name: Meta-Llama-3-8B-Instruct
        if key.startswith(vendor) and len(key) > len(vendor):
            found = _resolve(key[len(vendor) :])
            if found is not None:
                return found
            key = key[len(vendor) :]
            break
    # a VL checkpoint takes a part of its name only where that entry has a vision tower: one
    # holding a text model's name (LLaVA-...-Mistral-7B) is priced by a VL stand-in
    # (rpeg.perf.validation.stand_in), its tower kept
    vl = vision_name(name)
    words = key.split("-")
    for n in range(len(words) - 1, 0, -1):  # the longest head ending in a size: a fine-tune
        if _SIZE.match(words[n - 1]):
            found = _resolve("-".join(words[:n]))
            if found is not None and _keeps_vision(found[0], vl):
                return found[0], None
    # a base model's name inside a distilled checkpoint's (DeepSeek-R1-0528-Qwen3-8B): the
    # earliest, longest run of two or more words ending in a size that an entry holds
    for start in range(1, len(words) - 1):
        for end in range(len(words), start + 1, -1):
            if _SIZE.match(words[end - 1]):
                found = _resolve("-".join(words[start:end]))
                if found is not None and _keeps_vision(found[0], vl):
                    return found[0], stated_kind(name)
    return None


def _keeps_vision(entry: str, vl: bool) -> bool:
    """Whether catalog ``entry`` may price a checkpoint whose name is (``vl``) or is not a
    vision-language model's: a VL name needs an entry with a vision tower."""
    from rpeg import specs

    return not vl or specs.model(entry).vision is not None


def known_model(name: str) -> bool:
    """Whether ``name`` prices: a catalog model or a stand-in (rpeg.perf.validation.stand_in)."""
    from rpeg import specs

    try:
        specs.model(name)
    except specs.SpecError:
        return False
    return True


def _resolve(key: str) -> tuple[str, str | None] | None:
    """:func:`resolve_model` of a catalog key as written, without the fine-tune rule; None
    when nothing matches."""
    from rpeg import specs

    catalog = specs.models()
    if key in catalog:
        return key, None
    compact = {compact_name(n): n for n in catalog}
    # the transformers-format suffix (Llama-2-7b-chat-hf), then release date (-2507) and
    # version (-v0.1) suffixes
    stem, kind = (
        re.sub(r"-(?:\d{4}|v\d+(?:\.\d+)*)$", "", re.sub(r"-hf$", "", _QUANT.sub("", key))),
        None,
    )
    for _ in range(2):
        if compact_name(stem) in compact:
            return compact[compact_name(stem)], kind
        head, _, last = stem.rpartition("-")
        if not head or last not in SUFFIX_KIND:
            break
        stem, kind = head, kind or SUFFIX_KIND[last]
    if compact_name(stem) in compact:
        return compact[compact_name(stem)], kind
    if compact_name(stem + "-instruct") in compact:  # a base checkpoint of a cataloged instruct
        return compact[compact_name(stem + "-instruct")], kind or "base"
    return None


def model_name(r: dict[str, str]) -> str:
    """The catalog model a row names (see :func:`resolve_model`)."""
    return resolve_model(r.get("model") or "")[0]


# words of a GPU's marketing name that do not tell catalog GPUs apart: the vendor, the memory
# technology ("HBM3"), the form factor of the SXM / OAM parts, the system it sits in (HGX/DGX boards,
# a GB200 NVL72 rack; "H100 NVL", a card of its own, is matched whole first)
_GPU_NOISE = re.compile(
    r"^(?:nvidia|amd|huawei|instinct|tesla|geforce|hbm\d*e?|sxm\d?|oam|hgx|dgx|nvl\d+"
    # architecture and edition words: "Hopper H100", "RTX PRO 6000 Blackwell Server Edition"
    r"|volta|ampere|hopper|blackwell|server|workstation|edition)$"
)
_GPU_MEMORY = re.compile(r"^\d+(?:gb?)$")
#: a count before a GPU name ("8xH100", "8 x A100"): not part of the name
GPU_COUNT = re.compile(r"^\s*\d+\s*[x×*]\s*")


def gpu_name(r: dict[str, str]) -> str:
    """The catalog GPU a row names (``H100`` -> ``h100-sxm``, ``A800-80GB`` -> ``a800``,
    ``NVIDIA H100 80GB HBM3``, ``H100 (80GB)``, ``8xH100`` -> ``h100-sxm``, ``A100-PCIe-80GB`` ->
    ``a100-pcie``): the name
    as written, an alias, or -- dropping the vendor, memory technology and SXM words, then the
    memory size -- the first of those that the catalog or the aliases hold. The name as
    written when none does (refused by :func:`unknown_names`)."""
    from rpeg import specs

    # a count before the name ("8xH100", "8 x A100") and brackets around a word ("H100
    # (80GB)") are not the GPU's name
    k = catalog_key(GPU_COUNT.sub("", r.get("gpu") or ""))
    catalog = specs.gpus()
    words = [w for w in (w.strip("()[]") for w in k.split("-")) if w]
    plain = [w for w in words if not _GPU_NOISE.match(w)]
    sizeless = [w for w in plain if not _GPU_MEMORY.match(w)]
    for cand in (k, "-".join(plain), "-".join(sizeless)):
        cand = GPU_ALIASES.get(cand, cand)
        if cand in catalog:
            return cand
    return GPU_ALIASES.get(k, k)


def unknown_names(r: dict[str, str]) -> str:
    """'' or the reason a row names a model or GPU the catalogs do not hold."""
    from rpeg import specs

    bad = []
    for k in ("model", "gpu"):
        if not (r.get(k) or "").strip():
            bad.append(f"{k} not published (a catalog name: `rpeg specs list`)")
    if bad:
        return "; ".join(bad)
    if not known_model(model_name(r)):
        bad.append(
            f"unknown model {r.get('model')!r} (add it: rpeg specs add-model --from-hf config.json)"
        )
    if gpu_name(r) not in specs.gpus():
        bad.append(
            f"unknown GPU {r.get('gpu')!r} (add it to the user gpus.yaml; catalog: "
            f"{', '.join(sorted(specs.gpus()))})"
        )
    return "; ".join(bad)


_NUMBER = re.compile(
    r"^\s*(?:~|≈|about\s+|approx\.?\s*)?"
    r"([-+]?(?:\d{1,3}(?:[,_]\d{3})+(?:\.\d*)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
)
#: what may follow a number: nothing, an annotation ("8 (inferred)", "4096 tokens", "1-step",
#: "92.8*", "3200+", "95 avg") or a word naming what it counts; a letter or word of another unit
#: ("16gb", "2M", "16 GB", "95,000 ms", "2 nodes") may not, with or without a space before it,
#: nor a second number ("1:32", "8-16", "8/8": a ratio or range is not one number)
_ANNOTATION = re.compile(
    r"^\s*(?:$|(?![:/\-–]\s*\d)[^\w\s]|(?:s|sec|secs|seconds?|tok|tokens?|gpus?|steps?|prompts?|samples?|"
    r"approx|approximately|about|avg|average|mean|median|est|estimated|inferred|assumed|"
    r"measured|reported|per)\b)",
    re.I,
)
#: a duration written in units: 1h2m, 1m32s, 2 min
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*h(?:ours?)?)?\s*(?:(\d+(?:\.\d+)?)\s*m(?:in)?)?"
    r"\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$"
)
#: a clock duration: 1:32 (m:ss), 1:02:05 (h:mm:ss)
_CLOCK = re.compile(r"^\s*(?:(\d+):)?(\d+):([0-5]\d(?:\.\d+)?)\s*$")
#: milliseconds: 95000ms, 95,000 ms
_MILLIS = re.compile(r"^\s*(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?)\s*ms\s*$", re.I)
#: columns that are token caps: "16k" is 16,384 there (context sizes are powers of two), 1,000
#: elsewhere ("1.2k" mean tokens)
_CAPS = ("max_gen_len", "max_seq_len", "gen_cap")


def cell_number(r: dict[str, str], k: str) -> float | None:
    """The number of column ``k``; None when blank. Read: "8", "8.0", "~8" (approximate), "1,024",
    an annotation after it ("8 (inferred)", "92.8 s"), a recipe key before it ("n=8"), a thousands suffix ("16k": 16,384 in
    a token cap, else 16,000), a product of counts ("8x2"), a duration in a seconds column
    ("1m32s", "1:32", "95000 ms"), a percentage ("60%": 0.6). Anything else -- a unit it does not know ("16gb") -- is a row the model cannot
    read, reported with the column and value (never read as its leading digits)."""
    v = (r.get(k) or "").strip()
    if not v:
        return None
    # a recipe's key before the value ("n=8", "rollout.n: 8", "tp = 4") names the cell's quantity
    v = re.sub(r"^[A-Za-z_][\w.]*\s*[=:]\s*(?=[~≈\d.+-])", "", v)
    if k.endswith("_s"):
        d = _DURATION.match(v)
        if d is not None and (d.group(1) or d.group(2)):
            h, mi, sec = (float(x) if x else 0.0 for x in d.groups())
            return 3600 * h + 60 * mi + sec
        c = _CLOCK.match(v)
        if c is not None:
            h, mi, sec = (float(x) if x else 0.0 for x in c.groups())
            return 3600 * h + 60 * mi + sec
        ms = _MILLIS.match(v)
        if ms is not None:
            return float(ms.group(1).replace(",", "")) / 1000
    m = _NUMBER.match(v)
    if m is None:
        raise Unpredictable(f"{k}={v!r} is not a number")
    x, rest = float(re.sub(r"[,_]", "", m.group(1))), v[m.end() :]
    if re.match(r"^[kK]\b", rest):
        return x * (1024 if k in _CAPS else 1000)
    if rest.startswith("%"):
        return x / 100
    prod = re.match(r"^\s*[x×*]\s*(\d+)\b", rest)
    if prod is not None:
        return x * int(prod.group(1))
    if not _ANNOTATION.match(rest):
        raise Unpredictable(
            f"{k}={v!r} is not a number (a unit it does not know, or a second number)"
        )
    return x


def cell_int(r: dict[str, str], k: str, default: int | None = None, minimum: int = 1) -> int:
    """A count (GPUs, prompts, a layout size): a whole number >= ``minimum`` (``8.5`` GPUs is
    named, never read as 8)."""
    v = cell_number(r, k)
    if v is None:
        if default is None:
            raise Unpredictable(f"{k} not published")
        return default
    if v < minimum:
        raise Unpredictable(f"{k}={v:g}: must be >= {minimum}")
    if v != int(v):
        raise Unpredictable(f"{k}={v:g}: must be a whole number >= {minimum}")
    return int(v)


#: the longest step a row may state: a week (a larger value is a unit slip, not a run)
MAX_STEP_S = 7 * 86400.0


def measured_step(r: dict[str, str]) -> float | None:
    """The row's ``measured_step_s`` in seconds (None: blank): > 0 and at most
    :data:`MAX_STEP_S`, else named."""
    step = cell_number(r, "measured_step_s")
    if step is not None and not step > 0:
        raise Unpredictable(f"measured_step_s={step:g}: must be a positive number of seconds")
    if step is not None and step > MAX_STEP_S:
        raise Unpredictable(
            f"measured_step_s={step:g}: more than a week ({MAX_STEP_S:,.0f} s) for one step; "
            "allowed: seconds in (0, 604800]"
        )
    return step


def cell_opt_int(r: dict[str, str], k: str) -> int | None:
    """A layout count that may be blank (None = to be solved)."""
    return None if cell_number(r, k) is None else cell_int(r, k)


def cell_float(r: dict[str, str], k: str) -> float | None:
    """A positive measurement; blank or 0 = unpublished (None); a negative value is a row
    the model cannot read (it was silently replaced by the prior, issue 44)."""
    v = cell_number(r, k)
    if v is not None and v < 0:
        raise Unpredictable(f"{k}={v:g}: must be >= 0 (blank when not published)")
    return None if v is None or v <= 0 else v


_YES = ("yes", "true", "1", "y", "on", "enabled")
_NO = ("no", "false", "0", "n", "off", "disabled")
#: column -> words that state it (AReaL's "interruptible" generation is a partial rollout)
_TRI_WORDS = {"partial_rollout": {"interruptible": True, "partial": True}}


def cell_tri(r: dict[str, str], k: str) -> bool | None:
    """yes/no column; None when blank. Anything else is named."""
    v = (r.get(k) or "").strip().lower()
    if not v:
        return None
    head = re.split(r"[\s(;,]", v, maxsplit=1)[0]  # "yes (interruptible)", "no - sync"
    for word in (v, head):
        if word in _YES:
            return True
        if word in _NO:
            return False
        if word in _TRI_WORDS.get(k, {}):
            return _TRI_WORDS[k][word]
    raise Unpredictable(f"{k}={v!r}; allowed: yes, no, or blank (unknown)")


#: the lag as the systems name it: on-policy / sync 0, verl's one-step-off 1 ("off-policy 2"
#: is read by its number; a bare "async" or "off-policy" states no bound and is refused)
NAMED_LAGS = {
    "on-policy": 0,
    "on policy": 0,
    "sync": 0,
    "synchronous": 0,
    "one-step": 1,
    "one-step-off": 1,
    "one step off": 1,
    "one-step off-policy": 1,
}


def cell_staleness(r: dict[str, str]) -> int:
    """Policy lag bound. 'inf' = unbounded; a fraction (verl's staleness_threshold, the
    share of a step's samples that may come from the previous weights) still lets the
    rollout run ahead of the trainer, i.e. a lag of up to one version: rounded up."""
    st = (r.get("staleness") or "").strip().lower()
    if st in ("inf", "infinite", "unbounded"):
        return 10**6
    if st in NAMED_LAGS:
        return NAMED_LAGS[st]
    m = re.fullmatch(r"(?:off[- ]policy|async(?:hronous)?|lag|staleness)\s*[=:(]?\s*(\d+)\)?", st)
    if m:
        return int(m.group(1))
    try:
        v = cell_number(r, "staleness")
    except Unpredictable:
        raise Unpredictable(
            f"staleness={st!r} states no bound; allowed: the policy lag in versions (0 "
            "on-policy, 1 one-step-off, a fraction as verl's staleness_threshold), inf, "
            "'off-policy N', or blank"
        ) from None
    if v is None:
        return 1 if cell_tri(r, "partial_rollout") else 0
    if v < 0:
        raise Unpredictable(f"staleness={v:g}: must be >= 0")
    return math.ceil(v - 1e-9) if v < 10**6 else 10**6
