"""What a published row's free-text columns say about the columns beyond the shared schema
(pure).

A run described only by the shared schema (../shared/validation's columns: the ones a user
fills) leaves the recipe columns blank -- activation checkpointing, packing, the engine's
memory share, the executing system, a base checkpoint -- and often states them in its
``notes`` / ``model_arch_notes`` (a recipe's ``act_ckpt=True``, a script's
``gpu_memory_utilization=0.7``, "Base checkpoint"). Here each such column is read from that
text where the text is *unambiguous*: one recognised statement, or several that agree; two
statements that disagree (``mem_fraction 0.8 (0.7 for >1B)``) leave the column blank, and a
column the row states itself is never overridden. The system is the family that publishes
or runs the row (the ``train_backend`` cell, else the ``source`` / ``measured_by`` cells,
when the notes name no other family) with its training backend. docs/validation.md, "The
published-runs data set".
"""

from __future__ import annotations

import re

#: free-text columns read for recipe settings
TEXT = ("notes", "model_arch_notes")

_TRUE = {"true", "yes", "1", "full", "on"}
_FALSE = {"false", "no", "0", "none", "off", "selective"}
_FLAGS = r"(true|false|yes|no|1|0|full|selective|none|on|off)\b"

#: column -> patterns whose first group is a true/false word
_BOOL: dict[str, tuple[str, ...]] = {
    "act_ckpt": (
        r"\b(?:act(?:ivation)?_?ckpt|activation_checkpointing|gradient_checkpointing|"
        r"enable_gradient_checkpointing|recompute_granularity|recompute_activations?)"
        r"\s*[=:]?\s*" + _FLAGS,
    ),
    "seq_packing": (r"\bseq(?:uence)?_packing\s*[=:]?\s*" + _FLAGS,),
    "reuse_rollout_logprobs": (r"\buse_rollout_log_probs\s*[=:]?\s*" + _FLAGS,),
    "enforce_eager": (r"\benforce_eager\s*[=:]\s*" + _FLAGS,),
    "cpu_adam": (r"\badam_offload\s*[=:]\s*" + _FLAGS,),
    # NeMo-Aligner's ``trt_llm.reshard``: the engine folds the trainer's pipeline stages into
    # data parallelism (tensor parallelism only for inference)
    "gen_reshard": (r"\breshard\s*[=:]\s*" + _FLAGS,),
}
#: column -> phrases that state the value without a flag
_PHRASES: dict[str, tuple[tuple[str, str], ...]] = {
    "act_ckpt": ((r"\bactivation (?:checkpointing|recompute) (?:on|enabled)\b", "yes"),),
    # verl's dynamic batch size packs a micro-batch to a token budget; remove_padding
    # concatenates the sequences (both: no padding tokens are computed)
    "seq_packing": (
        (r"\b(?:use_)?dynamic[_ ]bsz\b", "yes"),
        (r"\b(?:use_)?remove_padding\b", "yes"),
    ),
    "reuse_rollout_logprobs": ((r"\bold_log_prob not recomputed\b", "yes"),),
    "gen_reshard": (
        (r"\breshard(?:ing)? (?:turned )?(?:off|disabled)\b|\bwithout reshard", "no"),
        (r"(?<!without )\breshard\b(?!\s*[=:]| (?:turned )?(?:off|disabled)\b)", "yes"),
    ),
    # the rollout engine without CUDA graphs: vLLM's flag named bare ("vLLM TP4
    # enforce_eager"), SGLang's disable_cuda_graph
    "enforce_eager": (
        (r"\benforce_eager\b(?!\s*[=:])", "yes"),
        (r"\bdisable_cuda_graph\b(?!\s*[=:]\s*(?:false|0|no)\b)", "yes"),
        (r"\bcuda graphs? (?:disabled|off)\b", "yes"),
    ),
    # the optimizer's step on the host: OpenRLHF's ``--adam_offload``, DeepSpeed's
    # ``offload_optimizer`` (ZeRO-Offload's CPU Adam). verl's ``optimizer_offload`` is not it:
    # the state waits on the host between phases and the step runs on the GPU
    "cpu_adam": (
        (r"\badam[_ ]offload(?:ed|ing)?\b(?!\s*[=:])", "yes"),
        (r"\boffload_optimizer\b|\bcpu[_ ]?adam\b|\bzero-offload\b", "yes"),
    ),
    "model_kind": (
        (r"\bbase (?:checkpoint|model)\b", "base"),
        (r"\binstruct (?:checkpoint|model)\b", "instruct"),
        # Qwen3-style hybrid models: the chat template's thinking switch
        (
            r"\benable_thinking\s*[=:]\s*(?:false|0|no)\b|\bthinking (?:mode )?(?:disabled|off)\b"
            r"|/no_think\b|\bnon-thinking\b",
            "instruct",
        ),
        (
            r"\benable_thinking\s*[=:]\s*(?:true|1|yes)\b|\bthinking (?:mode )?(?:enabled|on)\b",
            "reasoning",
        ),
    ),
    # a learned reward model scores the samples (RLHF PPO) or rules / a verifier do; a
    # negated mention ("no reward model") is the second kind (verl's ``reward_model.*``
    # config keys name its reward manager too: not read)
    "reward_model": (
        (
            r"(?<!no )(?<!without )(?<!without a )(?<!instead of a )\breward model\b"
            r"|\breward_pretrain\b|\bbradley[- ]terry\b",
            "yes",
        ),
        (
            r"\b(?:no|without a?|instead of a) reward model\b|\brule[- ]based reward"
            r"|\bverifiable rewards?\b|\bremote_rm_url\b|\breward function\b",
            "no",
        ),
    ),
    # what the prompts ask for, named by a benchmark or a data set of one domain: code
    # (programs checked by tests) or math. Bare words are not read ("verl code",
    # "Qwen2.5-Math"), nor a name that is also a model or recipe unless it names the data
    # ("DeepScaleR data", not "DeepScaleR's recipe"); a row naming both domains is left blank
    "task_domain": (
        (
            r"\blivecodebench\b|\bcodeforces\b|\bcode_?contests\b|\bhumaneval\b|\bmbpp\b"
            r"|\btaco-verified\b|\bcompetitive programming\b|\bcode generation\b"
            r"|\bcoding (?:problems|tasks)\b|\bdeepcoder(?:-preview)? (?:data|problems|prompts)",
            "code",
        ),
        (
            r"\baime(?: ?(?:20)?2[45])?\b|\bmath-?500\b|\bgsm8k\b|\bnuminamath\b|\bdapo-math\b"
            r"|\bmath (?:data|problems|reasoning|rl)\b|\bdeepscaler(?:-preview)? (?:data|problems|prompts)",
            "math",
        ),
    ),
    # DeepSpeed-Chat generates inside its training engine (the "hybrid engine"): HF-style
    # static batches, no continuous batching (verl also calls its colocation a hybrid engine)
    "gen_batching": (
        (r"\bdeepspeed[- ]?chat\b.{0,200}\bhybrid[_ ]engine\b", "static"),
        (r"\bhybrid[_ ]engine\b.{0,200}\bdeepspeed[- ]?chat\b", "static"),
    ),
    # speculative decoding: EAGLE is only a draft method; MTP heads may only be trained,
    # so MTP counts where the text speaks of speculative decoding or drafts
    "spec_decode": (
        (r"\beagle(?:-?\d)?\b", "eagle"),
        # SGLang's name for DeepSeek-style MTP drafting (``speculative_algorithm NEXTN``)
        (r"\bnextn\b", "mtp"),
        (
            r"\bmtp\b(?=.{0,80}(?:\b|_)(?:speculative|draft))|(?:\b|_)(?:speculative|draft).{0,80}\bmtp\b",
            "mtp",
        ),
        (
            r"\bmtp (?:disabled|off)\b|\b(?:without|no) mtp\b|\bmtp\s*[=:]\s*(?:false|off|none|0)\b",
            "none",
        ),
    ),
}
#: column -> pattern whose first group is the number
_NUMBERS: dict[str, str] = {
    "zero_stage": r"\bzero(?:_stage\s*[=:]?\s*|[- ]?stage[- ]?|-)([0-3])\b",
    # DeepSpeed-Chat's and NeMo-Aligner's (``ppo.rollout_micro_batch_size``) static batch
    "gen_batch_size": r"\b(?:per_device_generation_batch_size|rollout_micro_batch_size)\s*(?:[=:]|of)?\s*(\d+)\b",
    # drafts a step: vLLM's ``num_speculative_tokens``; SGLang's draft depth
    # ``speculative_num_steps``, its tree's verified width ``speculative_num_draft_tokens``
    # and candidates a draft pass keeps ``speculative_eagle_topk`` (flags spelled with - or _)
    "spec_draft_tokens": r"\b(?:num[-_]speculative[-_]tokens|speculative[-_]num[-_]steps)\s*[=:]?\s*(\d+)\b",
    "spec_verify_tokens": r"\bspeculative[-_]num[-_]draft[-_]tokens\s*[=:]?\s*(\d+)\b",
    "spec_topk": r"\bspeculative[-_]eagle[-_]topk\s*[=:]?\s*(\d+)\b",
    # the engine's cap on sequences in flight (vLLM ``max_num_seqs``, SGLang
    # ``max_running_requests``)
    "gen_max_seqs": r"\b(?:max[-_]num[-_]seqs|max[-_]running[-_]requests)\s*[=:]?\s*(\d+)\b",
    "spec_accept_len": r"\baccept(?:ance|ed)?[_ ]len(?:gth)?\s*(?:[=:]|of)?\s*(\d+(?:\.\d+)?)",
    # the batch as the recipes name it: prompts per step (NeMo-RL ``num_prompts_per_step``,
    # verl ``data.train_batch_size``, OpenRLHF / slime ``rollout_batch_size``) and samples per
    # prompt (NeMo-RL ``num_generations_per_prompt``, verl ``rollout.n``, OpenRLHF / slime
    # ``n_samples_per_prompt``, TRL ``num_generations``). A bare ``train_batch_size`` is not
    # read: DeepSpeed and OpenRLHF count samples per optimizer step with it
    "num_prompts": (
        r"(?:\bnum_prompts_per_step|\bdata\.train_batch_size|\brollout[_-]batch[_-]size)"
        r"\s*[=:]?\s*(\d+)\b"
    ),
    "samples_per_prompt": (
        r"(?:\bnum_generations(?:_per_prompt)?|\brollout\.n|\bn[_-]samples[_-]per[_-]prompt)"
        r"\s*[=:]?\s*(\d+)\b"
    ),
}
#: a trainer's micro-batch token budget per GPU (verl ``ppo_max_token_len_per_gpu`` with
#: dynamic bsz, often written as a multiple of the sequence budget; AReaL's dynamic
#: micro-batches): ``micro_batch_tokens`` as tokens, or ``<n>x`` of prompt + response
_MB_MULTIPLE = r"\bppo_max_token_len_per_gpu\s*[=:]?\s*(\d+)\s*[x*×]\s*\(\s*prompt\s*\+\s*resp"
_MB_TOKENS = (
    r"\bppo_max_token_len_per_gpu\s*[=:]?\s*(\d[\d,]*)\b(?!\s*[x*×])",
    r"\bmax (\d[\d,]*) tok(?:ens)?\s*/\s*gpu\b",
    r"\bdynamic micro-?batch(?:es|ing)? with (?:a )?(\d[\d,]*)-token budget\b",
)
_UTIL = (
    r"\b(?:vllm_)?gpu_mem(?:ory)?_util(?:ization)?\s*[=:]?\s*(0?\.\d+|1\.0)\b",
    r"\bmem_fraction(?:_static)?\s*[=:]?\s*(0?\.\d+)\b",
)
#: family -> pattern naming it
FAMILIES: dict[str, str] = {
    "nemo-rl": r"\bnemo[- _]?rl\b",
    # EasyR1 (hiyouga/EasyR1) is a fork of verl: its FSDP actor and in-process vLLM rollout
    "verl": r"\bverl\b|\beasy-?r1\b",
    "areal": r"\bareal\b|\brealhf\b",
    "slime": r"\bslime\b|\bmiles\b",
    "openrlhf": r"\bopenrlhf\b",
    "deepspeed-chat": r"\bdeepspeed[- ]?chat\b|\bds-?chat\b",
    "skyrl": r"\bskyrl\b",
    "trl": r"\btrl\b|\bgrpotrainer\b",
    "nemo-aligner": r"\bnemo[- _]?aligner\b",
}


#: the trainer a family runs when a row leaves ``train_backend`` blank: verl's
#: ``actor.strategy`` defaults to fsdp, NeMo-RL's example configs enable the DTensor (FSDP2)
#: policy and leave Megatron off, OpenRLHF and DeepSpeed-Chat train with DeepSpeed only,
#: SkyRL's trainer strategy is FSDP, slime/Miles and NeMo-Aligner train with Megatron
DEFAULT_BACKEND = {
    "verl": "fsdp",
    "nemo-rl": "dtensor",
    "openrlhf": "deepspeed",
    "deepspeed-chat": "deepspeed",
    "skyrl": "fsdp",
    "slime": "megatron",
    "nemo-aligner": "megatron",
}


def _system(family: str, backend: str) -> str:
    """The name in rpeg.perf.systems.SYSTEMS of ``family`` with ``backend`` (blank: the
    family's default, :data:`DEFAULT_BACKEND`); '' when the pair names none."""
    backend = backend.strip() or DEFAULT_BACKEND.get(family, "")
    mega = "megatron" in backend
    fsdp = any(k in backend for k in ("fsdp", "dtensor"))
    if family == "nemo-rl":
        return "nemo-rl-megatron" if mega else ("nemo-rl-dtensor" if fsdp else "")
    if family == "verl":
        return "verl-megatron" if mega else ("verl-fsdp" if fsdp else "")
    if family == "slime":
        return "slime-megatron"
    if family == "openrlhf":
        return "openrlhf-deepspeed"
    if family == "deepspeed-chat":
        return "deepspeed-chat"
    return family  # areal, skyrl, trl, nemo-aligner


#: trainer words of a system cell or ``train_backend`` (the first that matches wins)
_TRAINERS = {
    "megatron": ("megatron", "mcore"),
    "fsdp": ("fsdp", "dtensor"),
    "deepspeed": ("deepspeed", "zero"),
}


def canonical_system(cell: str, backend: str = "") -> str:
    """A stated ``system`` cell as a name of rpeg.perf.systems.SYSTEMS when it names one
    family (``verl`` -> verl-fsdp, ``VeRL (Megatron)`` -> verl-megatron, ``OpenRLHF`` ->
    openrlhf-deepspeed, ``ReaLHF`` -> areal: the trainer from the cell or ``train_backend``,
    else the family's default); otherwise the cell normalised ('' stays '': not stated)."""
    from rpeg.perf.systems import SYSTEMS, normalise

    name = normalise(cell)
    if not name or name in SYSTEMS:
        return name
    fams = families(cell)
    if len(fams) != 1:
        return name
    text = f"{backend} {cell}".lower()
    trainer = next((t for t, words in _TRAINERS.items() if any(w in text for w in words)), "")
    found = _system(fams.pop(), trainer)
    return found if found in SYSTEMS else name


def families(text: str) -> set[str]:
    low = text.lower()
    return {f for f, pat in FAMILIES.items() if re.search(pat, low)}


def system_of(r: dict[str, str]) -> str:
    """The executing system the row's text names unambiguously; '' when it does not."""
    backend = (r.get("train_backend") or "").lower()
    own = families(backend)
    if len(own) == 1:
        return _system(own.pop(), backend)
    pub = families(" ".join(r.get(c) or "" for c in ("source", "source_locator", "measured_by")))
    other = families(" ".join(r.get(c) or "" for c in TEXT)) - pub
    if len(pub) == 1 and not other:
        return _system(pub.pop(), backend)
    # a publisher's table of another family's run (a paper's baseline): ``measured_by`` names
    # one family beyond the one the ``source`` names ("AReaL authors (measured with verl ...)")
    house = families(r.get("source") or "")
    ran = families(r.get("measured_by") or "") - house
    if len(house) == 1 and len(ran) == 1 and not other:
        return _system(ran.pop(), backend)
    if not pub and len(other) == 1:  # a paper or report naming no family: its notes' one
        return _system(other.pop(), backend)
    return ""


def _one(values: list[str]) -> str:
    return values[0] if values and all(v == values[0] for v in values) else ""


#: a model's nodes as NeMo-Aligner's docs give them ("actor on 8 nodes", "critic and reward
#: model server on 4 nodes")
_ON_NODES = r"\b{}\b[\w ,/-]{{0,40}}?\bon (\d+) nodes?\b"


def _critic_nodes(text: str) -> str:
    """The critic's own nodes where the text gives the actor's and the critic's apart (each
    with its own count: "actor and critic on 16 nodes" is one pool, not read)."""
    critic = {m.span(1): m.group(1) for m in re.finditer(_ON_NODES.format("critic"), text)}
    actor = {m.span(1) for m in re.finditer(_ON_NODES.format("actor"), text)}
    if not actor - set(critic):
        return ""  # no count of the actor's own
    return _one([n for span, n in critic.items() if span not in actor])


def read(r: dict[str, str]) -> dict[str, str]:
    """column -> value the row's free text states unambiguously (cells spelled as the
    columns take them: yes/no, a share, a kind, a system name)."""
    text = " ".join(r.get(c) or "" for c in TEXT).lower()
    out: dict[str, str] = {}
    for col in set(_BOOL) | set(_PHRASES):
        found = []
        for pat in _BOOL.get(col, ()):
            for m in re.finditer(pat, text):
                found.append("yes" if m.group(1) in _TRUE else "no")
        for pat, value in _PHRASES.get(col, ()):
            found += [value] * len(re.findall(pat, text))
        if col == "spec_decode" and set(found) == {"mtp", "eagle"}:
            found = ["mtp"]  # SGLang drafts with a model's MTP heads through its EAGLE worker
        if v := _one(found):
            out[col] = v
    utils = []
    for pat in _UTIL:
        for m in re.finditer(pat, text):
            utils.append(str(float(m.group(1))))
            # "0.8 (0.7 for >1B)": an alternative in brackets makes the statement conditional
            alt = re.match(r"\s*\((0?\.\d+)", text[m.end() :])
            if alt:
                utils.append(str(float(alt.group(1))))
    if u := _one(utils):
        out["gpu_memory_utilization"] = u
    for col, pat in _NUMBERS.items():
        if v := _one([str(float(m.group(1))) for m in re.finditer(pat, text)]):
            out[col] = v if col == "spec_accept_len" else str(int(float(v)))
    if v := _critic_nodes(text):
        out["critic_nodes"] = v
    budgets = [f"{int(m.group(1))}x" for m in re.finditer(_MB_MULTIPLE, text)]
    for pat in _MB_TOKENS:
        budgets += [str(int(m.group(1).replace(",", ""))) for m in re.finditer(pat, text)]
    if b := _one(budgets):
        out["micro_batch_tokens"] = b
    if s := system_of(r):
        out["system"] = s
    return out


def with_text(r: dict[str, str]) -> dict[str, str]:
    """``r`` with each blank column its free text states (:func:`read`) filled in; the
    cells the row states are kept."""
    fill = {k: v for k, v in read(r).items() if not (r.get(k) or "").strip()}
    return {**r, **fill} if fill else r
