"""One published-run CSV row -> what it describes (pure).

Every row is read from its own cells with the same rules for every source: no case id; the
free-text columns only fill a blank recipe column they state unambiguously
(rpeg.perf.validation.row_text). A blank cell means "unknown": layout fields (gen_tp, train_tp, the pool
split, gpu_memory_utilization) stay open and are solved (rpeg.perf.validation.solve); other unknowns
take the documented prior of :data:`PRIORS` and widen the row's interval
(rpeg.perf.interval). Column meanings: docs/validation.md, "The published-runs data set".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from rpeg.perf.calibration import SHIPPED, Calibration
from rpeg.perf.prediction import Workload
from rpeg.perf.validation.row_cells import (
    Unpredictable,
    cell_float,
    cell_int,
    cell_number,
    cell_opt_int,
    cell_staleness,
    cell_tri,
    cluster_for,
    derived_cluster,
    gpu_name,
    model_name,
    one_line,
    resolve_model,
)
from rpeg.perf.validation.solve import RowLayout, solve_row
from rpeg.perf.validation.system_defaults import (
    REFERENCE_SYSTEMS,
    STATIC_GEN_BATCH,
    critic_pool,
    eager_default,
    gen_max_seqs_default,
    padded_prompt,
    reward_model_default,
    system_prior,
    trl_transformers_generate,
    variant_defaults,
)
from rpeg.plan.schema import MAX_DEVICE_INDEX, GraphRef, Plan, UnitPlan

# Priors of inputs a row may leave blank (docs/validation.md, "Unknown inputs").
PRIORS: dict[str, Any] = {
    # DAPO-Math / OpenMathInstruct / DeepScaleR prompts with a chat template: 100-200 tokens
    # (NeMo-RL rows imply 102-148).
    "avg_prompt_len": 150.0,
    # RL recipes train long sequences with activation checkpointing (8 of the 10 recipes of
    # the shipped set: NeMo-RL Llama/DeepSeek-V3/Qwen3-235B, verl; off for NeMo-RL Qwen3-30B/
    # 32B) and pack micro-batches (NeMo-RL seq_packing, verl use_dynamic_bsz + remove_padding,
    # AReaL dynamic micro-batches). gpu_memory_utilization is not a prior: blank, it is
    # solved with the layout (rpeg.perf.validation.solve), since a budget too small for the weights + KV
    # is a cliff no operator runs at.
    "act_ckpt": True,
    "seq_packing": True,
    "streaming": False,
    "reuse_rollout_logprobs": False,
    # Response cap where neither max_gen_len nor max_seq_len is published: the budgets of
    # public RL recipes of the model's kind (reasoning: DAPO/DeepScaleR/AReaL 16-32k, here
    # 32,768; base/instruct: GSM8K/MATH recipes 1-4k, here 4,096). With max_seq_len the cap
    # is the budget minus the prompt (the engine never runs past it).
    "max_gen_len": {"reasoning": 32768, "base": 4096, "instruct": 4096},
    # No precision published: bf16 (every RL recipe of the shipped sets that states one).
    "precision": "bf16",
}

#: precision cells meaning fp32-master mixed precision with bf16/fp16 compute
AMP_NAMES = ("amp", "mixed", "bf16-mixed", "fp32-master", "mixed-precision")
#: other spellings of a precision (PyTorch dtype names; FP8 recipes by their format)
PRECISION_NAMES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "tf32": "fp32",  # fp32 weights, TF32 tensor-core matmuls
    "fp8-hybrid": "fp8",
    "fp8-e4m3": "fp8",
    "e4m3": "fp8",
}
#: other spellings of the two placements (only unambiguous ones: "hybrid" or "async" is not)
PLACEMENT_NAMES = {
    "colocate": "colocated",
    "co-located": "colocated",
    "collocated": "colocated",
    # verl's and OpenRLHF's "hybrid engine": generation and training share the GPUs (a bare
    # "hybrid" may mean a mix of both: refused)
    "hybrid-engine": "colocated",
    "shared": "colocated",
    "disaggregate": "disaggregated",
    "separate": "disaggregated",
    "separated": "disaggregated",
    "decoupled": "disaggregated",
    "split": "disaggregated",
    "dedicated": "disaggregated",
}


def placement_name(cell: str) -> str:
    """The placement a ``placement`` cell names: its first words before a bracket or a
    separator (``colocated (sync)``, ``disaggregated; 96:32``), case, spaces and underscores
    as one spelling (``Hybrid Engine``, ``co_located``), :data:`PLACEMENT_NAMES`' synonyms."""
    head = re.split(r"[(;,/]", cell, maxsplit=1)[0].strip().lower()
    head = re.sub(r"[\s_]+", "-", head)
    for name in (head, head.split("-", 1)[0]):  # whole, then its first word ("separate pools")
        name = PLACEMENT_NAMES.get(name, name)
        if name in ("colocated", "disaggregated"):
            return name
    return head


#: speculative decoding of the rollout engine (``spec_decode`` column): none, a model's
#: multi-token-prediction heads as the draft (one draft token per head), an EAGLE draft head
SPEC_METHODS = ("", "none", "mtp", "eagle")
#: EAGLE draft tokens per step where a row does not say (vLLM / SGLang RL recipes'
#: ``num_speculative_tokens`` 3)
EAGLE_DRAFT_TOKENS = 3

#: an ``algorithm`` cell naming only an offline method: no rollout, so no RL step (its online
#: variants -- "online dpo", "iterative dpo" -- generate, and are priced as a group baseline)
OFFLINE_METHODS = re.compile(
    r"(?:sft|supervised fine-?tuning|dpo|ipo|kto|orpo|simpo|cpo|rm|reward[- ]model(?: training)?"
    r"|(?:continued )?pre-?training)"
)


def critic_of(algo: str) -> bool:
    """Whether an algorithm named ``algo`` (lower case) trains a critic: PPO by name, GAE,
    VAPO / VC-PPO (value-based PPO) or any that says "critic", unless it says it has none."""
    if re.search(r"\bno critic\b|critic[- ]free|without (?:a )?critic", algo):
        return False
    if re.search(r"\b(?:gae|vapo|vc-ppo|actor-critic|critic)\b", algo):
        return True
    return bool(re.match(r"ppo\b", algo)) and "grpo" not in algo


def reference_of(algo: str, system: str) -> bool:
    """Whether a row that leaves ``has_ref`` blank runs a reference model: its algorithm's
    name where it speaks of a KL term ("GRPO + KL", "no KL"), else its system's default
    (:data:`REFERENCE_SYSTEMS`)."""
    if re.search(r"\bno[- ]kl\b|\bwithout (?:a )?kl\b|\bkl\s*[=:]\s*0(?:\.0+)?(?![\d.])", algo):
        return False
    if re.search(r"\bkl\b", algo):
        return True
    return system in REFERENCE_SYSTEMS


#: the most sequences a row may say an engine keeps in flight (``gen_max_seqs``): more is a
#: slip, not a run (vLLM's default is 1,024 on large GPUs, SGLang's set by its memory)
MAX_RUNNING_SEQS = 65536

#: what a model was trained to emit (``model_kind`` column; blank = the catalog's kind)
MODEL_KINDS = ("base", "instruct", "reasoning")
#: what the prompts ask for (``task_domain`` column; blank = not stated: no domain scale)
TASK_DOMAINS = ("code", "math")


@dataclass
class RowCase:
    """What a row describes, with its blank layout fields still open (``None``)."""

    graph: Any
    model: Any
    cluster_name: str
    num_gpus: int
    colocated: bool
    layout: RowLayout
    staleness: int
    partial: bool
    builder: str
    has_ref: bool
    reuse: bool
    streaming: bool
    util: float | None
    engine: str
    recompute: bool | None
    packing: bool
    workload: Workload
    unknown: tuple[str, ...]
    # the executing system (``system`` column; rpeg.perf.systems), '' = not stated
    system: str = ""
    # the row leaves the trainer's pipeline size blank (priced at 1 unless nothing fits:
    # rpeg.perf.validation.solve.solve_row)
    pp_open: bool = False
    # the row leaves the trainer's context-parallel size blank (1 unless nothing fits)
    cp_open: bool = False
    # the row leaves the engine's pipeline size blank (1 unless the model outgrows a node's
    # NVLink domain: rpeg.perf.validation.solve.candidates)
    gen_pp_open: bool = False
    # the reward is a learned model's forward (builders' reward="model"), not rule scoring
    reward_model: bool = False
    # the DeepSpeed ZeRO stage the row states (column or text); None: not stated
    zero_stage: int | None = None
    # a trainer GPU's micro-batch token budget in sequence budgets (``micro_batch_tokens`` /
    # (prompt + response cap)); None: the row is silent, one max-length sequence a micro-batch
    gpu_budget_seqs: float | None = None
    # the engine decodes without CUDA graphs (``enforce_eager`` column or text); blank: with
    enforce_eager: bool = False
    # a fit measure (rpeg.perf.validation.solve.solve_row): the trainer pool's models keep
    # their state on the host between uses, as OpenRLHF's ``--ref_reward_offload`` /
    # ``--adam_offload`` and DeepSpeed-Chat's offload do; colocated rows always do
    idle_offload: bool = False
    # every prompt padded to the prompt budget (:data:`PROMPT_PADDED_SYSTEMS`)
    prompt_padded: bool = False
    # the engine runs on the trainer's shards (a system's ``gen_layout: trainer`` and a blank
    # ``gen_tp``): its TP is the trainer's, its pipeline the trainer's unless ``gen_reshard``
    gen_from_trainer: bool = False
    gen_reshard: bool = False
    # GPUs of a pool of their own for the critic and the learned reward model, the last
    # ``critic_gpus`` of the row's (NeMo-Aligner's critic / reward-model server): their
    # forwards and the critic's update run there, beside the actor pool's; 0 = one pool
    critic_gpus: int = 0

    def budgets_per_micro_batch(self, cp: int) -> int:
        """Whole sequence budgets in one trainer micro-batch: a per-GPU token budget holds
        ``cp`` times its tokens over a context-parallel group (verl multiplies
        ``ppo_max_token_len_per_gpu`` by its sequence-parallel size); 1 when unstated."""
        if self.gpu_budget_seqs is None:
            return 1
        return max(1, int(self.gpu_budget_seqs * cp + 1e-9))

    def plan(self, lay: RowLayout) -> Plan:
        """The plan of this row with every layout field set (``lay``)."""
        from rpeg import specs

        n = self.num_gpus
        c = self.critic_gpus
        if self.colocated:
            gen_devs = train_devs = f"0-{n - c - 1}"
        else:
            gen_devs = f"0-{lay.gen_gpus - 1}"
            train_devs = f"{lay.gen_gpus}-{lay.gen_gpus + lay.train_gpus - 1}"
        try:
            gen = UnitPlan(
                devices=gen_devs,
                tp=lay.gen_tp,
                pp=lay.gen_pp,
                gpu_memory_utilization=lay.gpu_memory_utilization,
                offload=self.colocated,
                engine="vllm",
                enforce_eager=self.enforce_eager,
            )
            train = UnitPlan(
                devices=train_devs,
                tp=lay.train_tp,
                pp=lay.train_pp,
                cp=lay.train_cp,
                ep=lay.train_ep,
                engine=self.engine,
                recompute=lay.recompute,
                seq_packing=self.packing,
                micro_batch_size=self.budgets_per_micro_batch(lay.train_cp),
                offload=self.colocated or self.idle_offload,
                # published FSDP / ZeRO-3 runs (verl, OpenRLHF defaults) reshard after forward
                reshard_after_forward=True,
            )
        except ValueError as exc:
            raise Unpredictable(f"layout: {one_line(exc)}") from None
        critic = train
        if c:  # the critic's own pool: the trainer's layout over its GPUs, no other model
            critic = UnitPlan.model_validate(
                {
                    **train.model_dump(),
                    "devices": f"{n - c}-{n - 1}",
                    "pp": lay.critic_pp or lay.train_pp,
                    "offload": False,
                }
            )
        units = {}
        for name, members in _units(self.graph):
            # a learned reward model runs with the reference and the critic: a trainer-side
            # model (DeepSpeed-Chat's and OpenRLHF's ZeRO engines), not in the rollout engine
            on_gen = "generate" in members or ("reward" in members and not self.reward_model)
            on_critic = bool(members & {"values", "train_critic", "reward"}) and not on_gen
            units[name] = gen if on_gen else critic if on_critic else train
        cl = specs.cluster(self.cluster_name)
        return Plan(
            cluster=self.cluster_name,
            num_nodes=max(1, -(-n // cl.gpus_per_node)),
            model=self.model.name,
            graph=GraphRef(
                builder=self.builder,
                options={
                    "use_reference": self.has_ref,
                    "staleness": self.staleness,
                    "reuse_rollout_logprobs": self.reuse,
                    **({"reward": "model"} if self.reward_model else {}),
                },
            ),
            staleness=min(self.staleness, 10**6),
            partial_rollout=self.partial and self.staleness >= 1,
            streaming=self.streaming,
            units=units,
        )


def read_case(r: dict[str, str]) -> RowCase:
    """Parse one row (Unpredictable with the column and value when a cell is unusable).
    A blank column the row's free text states unambiguously takes that value
    (rpeg.perf.validation.row_text)."""
    from rpeg import specs
    from rpeg.ir import builders
    from rpeg.perf.validation.row_text import canonical_system, with_text

    own = frozenset(k for k, v in r.items() if (v or "").strip())  # the cells the row states
    r = with_text(r)
    model = specs.model(model_name(r))
    if model.unsupported:
        raise Unpredictable(f"model {model.name}: {model.unsupported}")
    # a model the catalog lacks, priced as the architecture nearest its stated size
    unknown: list[str] = [] if model.name in specs.models() else ["model"]
    gen_n = cell_opt_int(r, "gen_gpus")
    train_n = cell_opt_int(r, "train_gpus")
    placement = placement_name(r.get("placement") or "")
    if not placement:
        # blank: two pools that add up are disaggregated; otherwise one shared pool
        split = gen_n is not None and train_n is not None and gen_n != train_n
        placement = "disaggregated" if split else "colocated"
        unknown.append("placement")
    if placement not in ("colocated", "disaggregated"):
        raise Unpredictable(
            f"placement={(r.get('placement') or '').strip()!r}; allowed: colocated, "
            "disaggregated (or a synonym: colocate, hybrid engine, separate, decoupled, split)"
        )
    colocated = placement == "colocated"
    if cell_number(r, "num_gpus") is None and gen_n is not None and train_n is not None:
        n = gen_n if colocated else gen_n + train_n  # the pools say how many
    else:
        n = cell_int(r, "num_gpus")
    if n > MAX_DEVICE_INDEX:  # a slip (``1e9``), not a run: named before any plan is built
        cells = "num_gpus" if cell_number(r, "num_gpus") is not None else "gen_gpus + train_gpus"
        raise Unpredictable(f"{cells}={n}: at most {MAX_DEVICE_INDEX:,} GPUs")
    if colocated:  # colocated rows often leave the pool sizes blank: both roles use all
        stated = {k: v for k, v in (("gen_gpus", gen_n), ("train_gpus", train_n)) if v is not None}
        if any(v != n for v in stated.values()):
            said = ", ".join(f"{k}={v}" for k, v in stated.items())
            raise Unpredictable(
                f"placement=colocated shares one pool of num_gpus={n}, but {said}; allowed: "
                "the pools blank or equal to num_gpus, or placement=disaggregated"
            )
        gen_n = train_n = n
    else:
        if n < 2:
            raise Unpredictable(
                f"placement=disaggregated needs two pools of at least one GPU: num_gpus={n}; "
                "allowed: colocated, or num_gpus >= 2"
            )
        if gen_n is None and train_n is not None:
            gen_n = n - train_n
        elif train_n is None and gen_n is not None:
            train_n = n - gen_n
        if gen_n is not None and (gen_n < 1 or train_n < 1 or gen_n + train_n != n):
            raise Unpredictable(
                f"gen_gpus={gen_n} + train_gpus={train_n} must be two pools of num_gpus={n}"
            )
    staleness = cell_staleness(r)
    partial = bool(cell_tri(r, "partial_rollout"))
    # PPO with a learned critic: a value forward and a critic update on the trainer pool
    # (the critic is the actor's architecture, as in verl/OpenRLHF recipes by default).
    # A blank has_critic follows the algorithm's name (:func:`critic_of`).
    critic_cell = (r.get("has_critic") or "").strip()
    algo = (r.get("algorithm") or "").strip().lower()
    if OFFLINE_METHODS.fullmatch(algo):
        raise Unpredictable(
            f"algorithm={algo!r} trains offline (no rollout, no RL step to price); allowed: an "
            "RL algorithm (ppo, grpo, dapo, gspo, rloo, reinforce++, online dpo, ...) or blank"
        )
    has_critic = bool(cell_tri(r, "has_critic")) if critic_cell else critic_of(algo)
    # blank: on-policy without partial rollout, GRPO (no critic); the reference model as the
    # algorithm's name or the executing system's default says (:func:`reference_of`)
    unknown += [c for c in ("staleness", "partial_rollout", "has_ref") if not _cell(r, c)]
    if not critic_cell and not algo:
        unknown.append("algorithm")
    builder = "ppo" if has_critic else "grpo"
    system = canonical_system(r.get("system") or "", r.get("train_backend") or "")
    has_ref = cell_tri(r, "has_ref")
    if has_ref is None:
        has_ref = reference_of(algo, system)
    # the reward: a learned reward model's forward over every sample, or rule scoring on the
    # host; blank, the executing system's default (:func:`reward_model_default`)
    rm = cell_tri(r, "reward_model")
    if rm is None:
        rm = reward_model_default(system, has_critic)
        if rm:
            unknown.append("reward_model")
    graph = builders.build(
        builder,
        use_reference=has_ref,
        staleness=min(staleness, 1000),
        reward="model" if rm else "rule",
    )
    backend = (r.get("train_backend") or "").lower().strip()
    if not backend:  # blank: the executing system's trainer (row_text.DEFAULT_BACKEND)
        # (TRL trains under accelerate: DDP unless a ZeRO-3 / FSDP config shards it, which
        # its docs give for models past a GPU's memory: sharded as the likelier)
        sharded = (
            "verl-fsdp",
            "nemo-rl-dtensor",
            "openrlhf-deepspeed",
            "deepspeed-chat",
            "skyrl",
            "trl",
        )
        backend = "fsdp" if system in sharded else ""
        unknown.append("train_backend")
    # ZeRO-3 (DeepSpeed, OpenRLHF) shards parameters like FSDP; everything else (Megatron,
    # ReaL/AReaL 3D) keeps replicated TP/PP shards
    engine = "fsdp" if any(k in backend for k in ("fsdp", "deepspeed", "zero")) else "megatron"
    zero = cell_opt_int(r, "zero_stage")
    if zero is not None and zero not in (0, 1, 2, 3):
        raise Unpredictable(f"zero_stage={zero}; allowed: 0, 1, 2, 3 or blank")
    if zero is not None and zero < 3:
        # ZeRO-1/2: replicated weights, the optimizer (and gradients) sharded over the data
        # parallel ranks, no parameter gathers: priced as the distributed-optimizer trainer
        engine = "megatron"

    variant = variant_defaults(system, r, colocated)

    def prior(col: str) -> Any:
        v = cell_tri(r, col)
        if v is None:
            unknown.append(col)
            own = variant.get(col, system_prior(system, col))
            return PRIORS[col] if own is None else own
        return v

    util = cell_float(r, "gpu_memory_utilization")  # None: solved with the layout
    if util is None:
        unknown.append("gpu_memory_utilization")
    elif util > 1.0:
        raise Unpredictable(f"gpu_memory_utilization={util:g}: must be in (0, 1]")
    recompute, packing = prior("act_ckpt"), prior("seq_packing")
    streaming = prior("streaming") and not colocated and staleness == 0
    reuse = prior("reuse_rollout_logprobs")
    gpn = cell_number(r, "gpus_per_node")
    if gpn is not None and (gpn < 1 or gpn != int(gpn)):
        raise Unpredictable(f"gpus_per_node={gpn:g}: must be a whole number >= 1")
    cluster_name = cluster_for(gpu_name(r), int(gpn) if gpn is not None else None)
    if derived_cluster(cluster_name):
        unknown.append("cluster")  # the catalog has no node of this size: links derived
    node = specs.cluster(cluster_name).gpus_per_node
    critic_n, assumed_pool = critic_pool(r, system, has_critic, colocated, n, node, own)
    if assumed_pool:
        unknown.append("critic_gpus")  # the system's own share
    if critic_n:  # the actor's pool generates and trains; the critic's is the rest
        gen_n = train_n = n - critic_n
    prompt = cell_float(r, "avg_prompt_len")
    if prompt is None:
        unknown.append("avg_prompt_len")
        prompt = PRIORS["avg_prompt_len"]
    kind = (r.get("model_kind") or "").strip().lower() or resolve_model(r["model"])[1]
    if kind is not None and kind not in MODEL_KINDS:
        raise Unpredictable(f"model_kind={kind!r}; allowed: {', '.join(MODEL_KINDS)} or blank")
    domain = (r.get("task_domain") or "").strip().lower() or None
    if domain is not None and domain not in TASK_DOMAINS:
        raise Unpredictable(f"task_domain={domain!r}; allowed: {', '.join(TASK_DOMAINS)} or blank")
    max_seq = cell_float(r, "max_seq_len")
    cap_cell = cell_opt_int(r, "max_gen_len")
    if cap_cell is None:
        # unpublished: the length budget bounds it, else the prior of the model's kind
        unknown.append("max_gen_len")
        cap = int(max_seq) if max_seq else PRIORS["max_gen_len"][kind or model.kind]
        if not max_seq and system_prior(system, "max_gen_len"):
            cap = system_prior(system, "max_gen_len")
    else:
        cap = cap_cell
    explicit = cell_opt_int(r, "gen_cap")
    if explicit is not None:
        cap = min(cap, explicit)
    if max_seq:
        # an engine never runs a sequence past its length budget (vLLM max_model_len):
        # the response cap is at most the budget minus the prompt
        cap = int(min(cap, max_seq - prompt))
        if cap < 1:
            raise Unpredictable(f"max_seq_len={max_seq:g} leaves no room for a response")
    mean = cell_float(r, "avg_gen_len")
    if mean is None:
        unknown.append("avg_gen_len")
    elif mean > cap:
        cap, prompt = _cap_for_mean(r, mean, cap, prompt, max_seq, cap_cell, explicit)
    # (a cap raised past the row's to hold its published mean leaves the budget the rest)
    padded = padded_prompt(system, max_seq, None if cap_cell is None else max(cap_cell, cap))
    assumed: tuple[str, ...] = ()
    prompt_padded = padded is not None and padded > prompt
    if prompt_padded:
        # every pass computes the padded prompt, whatever the prompts' own lengths
        assumed = (
            f"prompts padded to the {padded:.0f}-token prompt budget ({system}'s collator: "
            "every pass runs the padded prompt)",
        )
        prompt = padded
        if "avg_prompt_len" in unknown:
            unknown.remove("avg_prompt_len")
    if cell_number(r, "train_minibatches") is None:
        unknown.append("train_minibatches")  # one optimizer step per RL step
    if not (r.get("precision") or "").strip():
        unknown.append("precision")
    # the first word: "bf16 (fp32 grads)", "BF16/FP32" (compute / master), "bf16 + fp8 rollout"
    prec = (
        re.split(r"[\s/+,(;]", (r.get("precision") or PRIORS["precision"]).strip())[0] or "bf16"
    ).lower()
    prec = PRECISION_NAMES.get(prec, prec)
    if prec in AMP_NAMES:
        # fp32 master weights, bf16 autocast compute: priced as bf16 compute with the same
        # 16 B/parameter of training state (fp32 weights 4 + grads 4 + Adam 8 = bf16 2 +
        # 2 + fp32 master and Adam 12)
        prec = "bf16"
    if prec not in ("bf16", "fp16", "fp8", "fp32"):
        raise Unpredictable(
            f"precision={prec!r}; allowed: bf16, fp16, fp8, fp32, amp (mixed, fp32 master)"
        )
    # blank: the system's own (DeepSpeed-Chat, NeMo-Aligner: static batches; TRL static in
    # transformers' generate unless its text names vLLM), else continuous
    batching = (
        (r.get("gen_batching") or "").strip().lower()
        or system_prior(system, "gen_batching")
        or ("static" if trl_transformers_generate(system, r) else "continuous")
    )
    if batching not in ("continuous", "static"):
        raise Unpredictable(f"gen_batching={batching!r}; allowed: continuous, static or blank")
    static = None
    if batching == "static":
        static = (
            cell_opt_int(r, "gen_batch_size")
            or system_prior(system, "gen_batch_size")
            or STATIC_GEN_BATCH
        )
        if static < 1:
            raise Unpredictable(f"gen_batch_size={static}: must be a whole number >= 1")
        if cell_opt_int(r, "gen_batch_size") is None:
            unknown.append("gen_batch_size")
    spec = (r.get("spec_decode") or "").strip().lower()
    if spec not in SPEC_METHODS:
        raise Unpredictable(
            f"spec_decode={spec!r}; allowed: {', '.join(SPEC_METHODS[1:])} or blank"
        )
    drafts = 0
    if spec in ("mtp", "eagle"):
        drafts = cell_opt_int(r, "spec_draft_tokens") or (
            (model.mtp_layers or 1) if spec == "mtp" else EAGLE_DRAFT_TOKENS
        )
        if cell_float(r, "spec_accept_len") is None:
            unknown.append("spec_accept_len")  # the prior (rpeg.perf.generation)
    # the engine's cap on sequences in flight: stated, else the one an engine sets itself
    max_seqs = cell_opt_int(r, "gen_max_seqs")  # a count: 0 or below is refused
    if max_seqs is not None and max_seqs > MAX_RUNNING_SEQS:
        if "gen_max_seqs" in own:
            raise Unpredictable(
                f"gen_max_seqs={max_seqs}: at most {MAX_RUNNING_SEQS:,} sequences in flight "
                "per engine (vLLM max_num_seqs, SGLang max_running_requests)"
            )
        max_seqs = None  # words beyond any engine's cap are not a statement: the default
    if max_seqs is None and (max_seqs := gen_max_seqs_default(system, r, drafts)):
        unknown.append("gen_max_seqs")
    # a draft tree (SGLang's EAGLE worker): candidates a draft pass keeps per sequence and
    # the tokens a verification runs; blank: a chain of the k drafts
    topk = cell_opt_int(r, "spec_topk") or 1
    verify = cell_opt_int(r, "spec_verify_tokens")
    widest = 1 + drafts * topk
    if drafts and verify is not None and not 2 <= verify <= widest:
        if {"spec_verify_tokens", "spec_topk", "spec_draft_tokens"} & own:
            raise Unpredictable(
                f"spec_topk={topk}, spec_verify_tokens={verify}: a draft tree verifies 2 to 1 + "
                f"spec_draft_tokens x spec_topk = {widest} tokens (blank: a chain)"
            )
        verify = min(max(2, verify), widest)  # words: the tree SGLang itself adjusts to
    # LM image tokens per sample: 0 stated is a text-only run of a vision model, blank the prior
    images = cell_number(r, "image_tokens")
    if images is not None and images < 0:
        raise Unpredictable(f"image_tokens={images:g}: must be >= 0 (blank when not published)")
    # PPO with a critic samples one response per prompt unless the row says otherwise
    # (verl ``rollout.n``, OpenRLHF ``n_samples_per_prompt`` and DeepSpeed-Chat default to
    # 1); a group-baseline algorithm has no default group size: its blank is refused
    # (unless the system's own configuration sets the group size: :data:`SYSTEM_PRIORS`)
    n_default = 1 if has_critic else system_prior(system, "samples_per_prompt")
    n_blank = n_default is not None and not _cell(r, "samples_per_prompt")
    missing = [c for c in ("num_prompts", "samples_per_prompt") if not _cell(r, c)]
    missing = [c for c in missing if not (n_blank and c == "samples_per_prompt")]
    if missing:  # the batch sets the step: no prior answers it
        raise Unpredictable(" and ".join(missing) + " not published")
    if n_blank:
        samples = n_default
        unknown.append("samples_per_prompt")
    else:
        samples = cell_int(r, "samples_per_prompt")
    wl = Workload(
        gen_static_batch=static,
        spec_draft_tokens=drafts,
        spec_accept_len=cell_float(r, "spec_accept_len") if drafts else None,
        spec_verify_tokens=verify if drafts else None,
        spec_topk=topk if drafts else 1,
        gen_max_seqs=max_seqs,
        num_prompts=cell_int(r, "num_prompts"),
        samples_per_prompt=samples,
        mean_prompt_tokens=prompt,
        max_response_tokens=cap,
        mean_response_tokens=mean,
        train_minibatches=cell_int(r, "train_minibatches", 1),
        precision=prec,
        max_seq_tokens=int(max_seq) if max_seq else None,
        response_kind=kind,
        task_domain=domain,
        image_tokens=images,
        assumed=assumed,
        # the optimizer's step on the host where the row says so (``cpu_adam``)
        assumed_optimizer_on_host=bool(cell_tri(r, "cpu_adam")),
    )
    if model.vision is not None and wl.image_tokens is None:
        unknown.append("image_tokens")  # the model's prior (rpeg.perf.units)
        if model.vision.image_tokens > 0 and "avg_prompt_len" not in unknown:
            # a published prompt length of a vision model already counts its images: the
            # processor expands each image's placeholder into its LM tokens before the
            # engine and the trainer see the prompt (Qwen2/2.5/3-VL; verl's and EasyR1's
            # prompt_length metrics count them). The images take what the text prior leaves,
            # at most the model's prior, and the prompt keeps its published length
            img = min(float(model.vision.image_tokens), max(0.0, prompt - PRIORS["avg_prompt_len"]))
            wl = replace(wl, mean_prompt_tokens=prompt - img, image_tokens=img)
    layout = RowLayout(
        gen_gpus=gen_n,
        train_gpus=train_n,
        gen_tp=cell_opt_int(r, "gen_tp"),
        gen_pp=cell_int(r, "gen_pp", 1),
        train_tp=cell_opt_int(r, "train_tp"),
        train_pp=cell_int(r, "train_pp", 1),
        train_cp=cell_int(r, "train_cp", 1),
        # a Megatron-style trainer of a MoE model with no published EP: solved like TP
        # (FSDP runs the experts unsplit: EP 1)
        train_ep=(
            cell_opt_int(r, "train_ep")
            if model.moe is not None and engine != "fsdp"
            else cell_int(r, "train_ep", 1)
        ),
        gpu_memory_utilization=util,
        recompute=recompute,
    )
    # an engine built from the trainer's shards takes its layout (blank gen_tp and gen_pp; on
    # the trainer's GPUs: a row splitting them into pools describes another arrangement)
    gen_from_trainer = (
        system_prior(system, "gen_layout") == "trainer"
        and colocated
        and layout.gen_tp is None
        and not (r.get("gen_pp") or "").strip()
    )
    eager = cell_tri(r, "enforce_eager")
    if eager is None:  # blank: the executing system's release default (eager_default)
        eager = eager_default(system, r)
        if eager:
            unknown.append("enforce_eager")
    group = (layout.train_tp or 1) * layout.train_pp * layout.train_cp
    if critic_n and "critic_gpus" not in unknown and (critic_n % group or (n - critic_n) % group):
        raise Unpredictable(
            f"critic_gpus={critic_n} (of num_gpus={n}): the critic's pool and the actor's "
            f"{n - critic_n} GPUs must each divide into the trainer's train_tp x train_pp x "
            f"train_cp = {group} groups"
        )
    _check_pools(layout, n, r)
    if "model" not in unknown:  # a stand-in's heads and layers are not the model's own
        _check_model_split(layout, model, r)
    return RowCase(
        graph=graph,
        model=model,
        cluster_name=cluster_name,
        num_gpus=n,
        colocated=colocated,
        layout=layout,
        staleness=staleness,
        partial=partial,
        builder=builder,
        has_ref=has_ref,
        reuse=reuse,
        streaming=streaming,
        util=util,
        engine=engine,
        recompute=recompute,
        packing=packing,
        workload=wl,
        unknown=tuple(unknown),
        system=system,
        enforce_eager=eager,
        reward_model=rm,
        zero_stage=zero,
        pp_open=not (r.get("train_pp") or "").strip(),
        cp_open=not (r.get("train_cp") or "").strip(),
        gen_pp_open=not (r.get("gen_pp") or "").strip(),
        critic_gpus=critic_n,
        gpu_budget_seqs=_gpu_budget_seqs(r, max_seq or prompt + cap),
        prompt_padded=prompt_padded,
        gen_from_trainer=gen_from_trainer,
        gen_reshard=bool(cell_tri(r, "gen_reshard")),
    )


def _gpu_budget_seqs(r: dict[str, str], seq_budget: float) -> float | None:
    """A trainer GPU's micro-batch token budget in sequence budgets, from
    ``micro_batch_tokens`` (verl's ``ppo_max_token_len_per_gpu`` under dynamic bsz, AReaL's
    dynamic micro-batch budget): a token count, or ``<n>x`` of the sequence budget (prompt +
    response cap). None when blank."""
    v = _cell(r, "micro_batch_tokens").lower()
    if not v:
        return None
    multiple = re.fullmatch(r"(\d+(?:\.\d+)?)\s*x", v)
    if multiple:
        n = float(multiple.group(1))
        if n < 1:
            raise Unpredictable(f"micro_batch_tokens={v!r}: a multiple must be >= 1x")
        return n
    tokens = cell_number(r, "micro_batch_tokens")
    if tokens is None or tokens < 1:
        raise Unpredictable(
            f"micro_batch_tokens={v!r}; allowed: tokens per GPU (>= 1), '<n>x' of the "
            "sequence budget, or blank"
        )
    return tokens / seq_budget


def _cap_for_mean(
    r: dict[str, str],
    mean: float,
    cap: int,
    prompt: float,
    max_seq: float | None,
    cap_cell: int | None,
    explicit: int | None,
) -> tuple[int, float]:
    """(response cap, prompt) for a published mean response longer than the cap the row's
    cells and priors give: a cap the row states (``max_gen_len``, ``gen_cap``,
    ``max_seq_len`` less a stated prompt) cannot be passed by the mean, so the row is named;
    a cap that rests on a prior gives way -- the prompt prior shrinks to what the length
    budget leaves, a blank budget becomes the long-generation one (``PRIORS['max_gen_len']``'s
    largest) or twice the mean."""
    stated_prompt = cell_float(r, "avg_prompt_len") is not None
    bounds = [("max_gen_len", cap_cell), ("gen_cap", explicit)]
    if max_seq:
        room = max_seq - prompt if stated_prompt else max_seq
        bounds.append(("max_seq_len - avg_prompt_len" if stated_prompt else "max_seq_len", room))
    for name, bound in bounds:
        if bound is not None and mean > bound:
            raise Unpredictable(
                f"avg_gen_len={mean:g} exceeds {name}={bound:g}: a mean response cannot pass "
                "its cap (avg_gen_len is the mean generated tokens per sample)"
            )
    if max_seq:  # the prompt prior left too little room: it gives way to the published mean
        prompt = max(1.0, min(prompt, max_seq - mean))
        return int(min(max_seq - prompt, cap_cell or max_seq, explicit or max_seq)), prompt
    blank_budget = max(max(PRIORS["max_gen_len"].values()), 2 * mean)
    return int(min(blank_budget, explicit or blank_budget)), prompt


def _cell(r: dict[str, str], k: str) -> str:
    return (r.get(k) or "").strip()


def assumed_values(case: RowCase, calib: Calibration = SHIPPED) -> tuple[str, ...]:
    """``column=value`` for each prior ``case`` took (its ``unknown`` columns but the
    layout ones, which are solved and listed apart), e.g. ``max_gen_len=32768``."""
    from rpeg.perf.lengths import code_scaled, prior_mean

    wl = case.workload

    def yn(v: Any) -> str:
        return "yes" if v else "no"

    kind = wl.response_kind or case.model.kind
    vision = case.model.vision
    values = {
        "placement": "colocated" if case.colocated else "disaggregated",
        "act_ckpt": yn(case.recompute),
        "seq_packing": yn(case.packing),
        "streaming": yn(case.streaming),
        "reuse_rollout_logprobs": yn(case.reuse),
        "avg_prompt_len": f"{wl.mean_prompt_tokens:.0f}",
        "max_gen_len": f"{wl.max_response_tokens}",
        "avg_gen_len": (
            f"{prior_mean(kind, wl.max_response_tokens, calib, domain=wl.task_domain):.0f} "
            f"({kind}{' code' if code_scaled(kind, wl.task_domain) else ''} prior)"
        ),
        "precision": wl.precision,
        "image_tokens": (
            f"{wl.image_tokens if wl.image_tokens is not None else vision.image_tokens:.0f}"
            if vision is not None
            else "0"
        ),
        "train_minibatches": f"{wl.train_minibatches}",
        "samples_per_prompt": (
            f"{wl.samples_per_prompt} "
            + ("(PPO with a critic)" if case.builder == "ppo" else f"({case.system}'s default)")
        ),
        "staleness": f"{case.staleness}",
        "partial_rollout": yn(case.partial),
        "has_ref": yn(case.has_ref),
        "algorithm": case.builder,
        "reward_model": yn(case.reward_model),
        "gen_batch_size": f"{wl.gen_static_batch} (static batches)",
        "gen_max_seqs": f"{wl.gen_max_seqs} (SGLang's default under speculative decoding)",
        "critic_gpus": f"{case.critic_gpus} ({case.system}'s critic and reward-model server)",
        "train_backend": case.engine,
        "cluster": case.cluster_name,
        "model": case.model.name,
        "enforce_eager": f"{yn(case.enforce_eager)} "
        + ("(transformers' generate)" if case.system == "trl" else "(verl <= 0.5 rollout default)"),
    }
    out = tuple(f"{u}={values[u]}" for u in case.unknown if u in values)
    if case.prompt_padded:  # known, not a prior: shown anyway
        out += (f"avg_prompt_len={wl.mean_prompt_tokens:.0f} (padded to the prompt budget)",)
    return out


def row_case(r: dict[str, str], calib: Calibration = SHIPPED) -> tuple[Any, Plan, Workload]:
    """The (graph, plan, workload) a CSV row describes, blank layout fields solved."""
    case = read_case(r)
    case, lay, _ = solve_row(case, calib)
    return case.graph, case.plan(lay), case.workload


def _units(graph: Any) -> list[tuple[str, set[str]]]:
    from rpeg.perf.units import graph_units

    return [(n, {k for _, k, _ in members}) for n, members in graph_units(graph)]


def _check_pools(lay: RowLayout, n: int, r: dict[str, str]) -> None:
    """Each stated model-parallel group divides its pool, named by the row's cells (before
    anything is priced): the trainer's ``train_tp x train_pp x train_cp`` its ``train_gpus``
    (``num_gpus`` colocated), the engine's ``gen_tp x gen_pp`` its ``gen_gpus``."""
    for side, parts, pool in (
        ("train", ("tp", "pp", "cp"), lay.train_gpus),
        ("gen", ("tp", "pp"), lay.gen_gpus),
    ):
        stated = [(f"{side}_{k}", getattr(lay, f"{side}_{k}")) for k in parts]
        stated = [(k, v) for k, v in stated if v is not None and _cell(r, k)]
        size = 1
        for _, v in stated:
            size *= v
        devices = pool or n
        own = _cell(r, f"{side}_gpus")
        where = f"{side}_gpus={devices}" if own or devices != n else f"num_gpus={n}"
        if stated and devices % size:
            cells = " x ".join(f"{k}={v}" for k, v in stated)
            if len(stated) > 1:
                cells += f" = {size}"
            raise Unpredictable(f"{cells} must divide the {side} pool's {devices} GPUs ({where})")


def _divisors(k: int) -> str:
    return ", ".join(str(d) for d in range(1, k + 1) if k % d == 0)


def _check_model_split(lay: RowLayout, model: Any, r: dict[str, str]) -> None:
    """Each stated split is one the model allows, named by the row's cell with the allowed
    values (as vLLM and Megatron refuse them at start): a TP divides the attention heads, a
    pipeline has at most one stage per decoder layer, an EP divides the routed experts (and
    is 1 on a dense model)."""
    name = _cell(r, "model") or "the model"
    for k in ("gen_tp", "train_tp"):
        v = getattr(lay, k)
        if _cell(r, k) and v is not None and model.heads % v:
            raise Unpredictable(
                f"{k}={v} must divide {name}'s {model.heads} attention heads; "
                f"allowed: {_divisors(model.heads)}"
            )
    for k in ("gen_pp", "train_pp"):
        v = getattr(lay, k)
        if _cell(r, k) and v > model.layers:
            raise Unpredictable(
                f"{k}={v} exceeds {name}'s {model.layers} decoder layers; allowed: 1-{model.layers}"
            )
    ep = lay.train_ep
    if _cell(r, "train_ep") and ep is not None and ep > 1:
        if model.moe is None:
            raise Unpredictable(f"train_ep={ep}: {name} has no routed experts; allowed: 1 or blank")
        if model.moe.experts % ep:
            raise Unpredictable(
                f"train_ep={ep} must divide {name}'s {model.moe.experts} routed experts; "
                f"allowed: {_divisors(model.moe.experts)}"
            )
