"""What each RL system does where a row is silent (pure): the defaults of verl, NeMo-RL,
OpenRLHF, DeepSpeed-Chat, NeMo-Aligner, TRL, slime and AReaL that a published row's blank
cells take -- their generation batching, reward and reference models, a critic's pool,
prompt padding, an eager engine, an engine's running-request cap -- each with its source.
rpeg.perf.validation.rows reads a row with them; each value taken is listed as assumed.
"""

from __future__ import annotations

import re
from typing import Any

from rpeg.perf.validation.row_cells import Unpredictable, cell_int, cell_number

#: sequences per generation batch of an engine without continuous batching where a row does
#: not say (DeepSpeed-Chat's ``per_device_generation_batch_size`` default)
STATIC_GEN_BATCH = 16

#: what a system's own configuration gives a column a row leaves blank, over :data:`PRIORS`
#: and the defaults above (each listed as assumed):
#: - DeepSpeed-Chat: no sample packing anywhere in its step 3 (its experience and training
#:   passes run the generate call's padded output; its Llama-2 scripts use
#:   ``per_device_training_batch_size 1``, the one-row micro-batch a silent row gets);
#: - TRL's GRPOConfig (huggingface/trl@f2cd57710 trl/trainer/grpo_config.py): ``padding_free``
#:   off, ``num_generations`` 8, ``max_completion_length`` 512, one ``generate`` call per
#:   process of its ``per_device_train_batch_size x steps_per_generation`` = 8 x 1 prompts;
#:   ``use_vllm=False`` (:func:`trl_transformers_generate`) and ``beta=0.0`` (no reference
#:   model: not in :data:`REFERENCE_SYSTEMS`)
#: TRL's ``num_generations`` (its group size; RPEG's own default is rpeg.defaults')
TRL_NUM_GENERATIONS = 8
SYSTEM_PRIORS: dict[str, dict[str, Any]] = {
    # DeepSpeed-Chat generates only in its hybrid engine (static batches)
    "deepspeed-chat": {"seq_packing": False, "gen_batching": "static"},
    # NeMo-Aligner's PPO actor generates (TensorRT-LLM, or Megatron's own generate) in static
    # batches of ``model.ppo.rollout_micro_batch_size`` (8) per data-parallel rank: the TRT-LLM
    # engine is built with that max batch and run unstreamed (NVIDIA/NeMo-Aligner @ af2b3bd9,
    # nemo_aligner/utils/trt_llm.py, examples/nlp/gpt/conf/gpt_ppo_actor.yaml)
    # Its TRT-LLM engine is built from the actor's own Megatron shards (``refit``: no layout
    # of its own): the trainer's tensor parallelism, and its pipeline too unless
    # ``trt_llm.reshard`` folds the stages into data parallelism for inference (the
    # docs' "training with pipeline parallelism but inference with tensor parallelism only";
    # the yaml default is off): ``gen_layout: trainer``
    "nemo-aligner": {"gen_batching": "static", "gen_batch_size": 8, "gen_layout": "trainer"},
    "trl": {
        "seq_packing": False,
        "samples_per_prompt": TRL_NUM_GENERATIONS,
        "max_gen_len": 512,
        "gen_batch_size": 8,
    },
}


def system_prior(system: str, col: str) -> Any:
    """The value ``system``'s own configuration gives a blank ``col``; None when it has none."""
    return SYSTEM_PRIORS.get(system, {}).get(col)


def _said(r: dict[str, str]) -> str:
    """A row's words that may name a release or an engine: its notes and source locator."""
    return " ".join((r.get(c) or "") for c in ("notes", "model_arch_notes", "source_locator"))


#: what verl's fully-async policy trainer does where a row does not say (verl
#: verl/experimental/fully_async_policy, config/fully_async_ppo_trainer.yaml and the
#: Megatron one @ b178a3cd5): ``async_training.use_rollout_log_probs: True`` (the rollout's
#: log-probs stand in for the old policy's: no recompute), and its trainer fetches
#: ``require_batches x ppo_mini_batch_size`` samples from the rollouter's message queue per
#: local update, so at ``staleness_threshold: 0`` it trains on a step's first samples while
#: the rest are generated (streaming)
FULLY_ASYNC_DEFAULTS: dict[str, Any] = {"reuse_rollout_logprobs": True, "streaming": True}
_FULLY_ASYNC = re.compile(r"\bfully[_ -]?async(?:hronous)?(?:[_ ]policy)?\b")


def variant_defaults(system: str, r: dict[str, str], colocated: bool) -> dict[str, Any]:
    """Defaults of a trainer variant a row's words name, ahead of :func:`system_prior`:
    :data:`FULLY_ASYNC_DEFAULTS` for a disaggregated verl row whose text names the
    fully-async policy trainer (its colocated baselines run verl's ordinary trainer); empty
    elsewhere."""
    if not system.startswith("verl") or colocated:
        return {}
    return dict(FULLY_ASYNC_DEFAULTS) if _FULLY_ASYNC.search(_said(r).lower()) else {}


def trl_transformers_generate(system: str, r: dict[str, str]) -> bool:
    """Whether a TRL row generates with transformers (its default) rather than vLLM: its
    text names no vLLM (``use_vllm=True``, "vLLM colocate", "vllm_mode")."""
    if system != "trl":
        return False
    text = _said(r)
    return not re.search(r"\bvllm", text.lower())


#: sequences in flight per SGLang server under speculative decoding where the run does not
#: set ``max_running_requests``: SGLang resets its default to 48 for its EAGLE / EAGLE3 /
#: standalone workers (python/sglang/srt/server_args.py, from 2025-07 through at least
#: 2026-04, "Max running requests is reset to 48 for speculative decoding"). verl hands
#: SGLang its own ``max_num_seqs`` (async_sglang_server.py since 2025-09), so its rows are
#: not capped
SGLANG_SPEC_MAX_RUNNING = 48
#: systems whose rollout engine is SGLang whatever the text says
SGLANG_SYSTEMS = ("slime-megatron", "areal")


def gen_max_seqs_default(system: str, r: dict[str, str], drafts: int) -> int | None:
    """The running-request cap a row's engine sets itself where the row states none:
    SGLang's under speculative decoding (:data:`SGLANG_SPEC_MAX_RUNNING`) for a system
    that does not pass its own; None elsewhere."""
    if not drafts or system.startswith("verl"):
        return None
    on_sglang = system in SGLANG_SYSTEMS or "sglang" in _said(r).lower()
    return SGLANG_SPEC_MAX_RUNNING if on_sglang else None


#: systems whose PPO (a learned critic) scores samples with a learned reward model unless a
#: row says otherwise: DeepSpeed-Chat's step 3 always does (its critic starts from the step-2
#: reward model); OpenRLHF's PPO trainer takes ``--reward_pretrain`` (a rule reward needs
#: ``--remote_rm_url``); NeMo-Aligner's PPO actor queries its reward model server
REWARD_MODEL_SYSTEMS = ("deepspeed-chat", "openrlhf-deepspeed", "nemo-aligner")


#: systems whose PPO serves the critic and the reward model from nodes of their own, and the
#: share of a run's GPUs they take where the row does not say: NeMo-Aligner's critic /
#: reward-model server ("PPO Performance Results with TensorRT-LLM", rlhf.rst: 8+4, 16+8,
#: 32+16, 64+32 and 84+42 actor + critic nodes)
CRITIC_POOL_SYSTEMS = {"nemo-aligner": 1 / 3}


def critic_pool(
    r: dict[str, str],
    system: str,
    has_critic: bool,
    colocated: bool,
    n: int,
    node: int,
    own: frozenset[str],
) -> tuple[int, bool]:
    """(GPUs of the critic's own pool -- :attr:`RowCase.critic_gpus` --, whether the system's
    share was assumed): the row's ``critic_gpus`` or ``critic_nodes`` (x ``node`` GPUs; 0:
    stated on the trainer's pool), else the system's share of ``n`` in whole nodes
    (:data:`CRITIC_POOL_SYSTEMS`); 0 = the critic on the trainer's pool.
    A stated pool needs a critic, the colocated actor pool beside it and GPUs left for it; a
    cell the row's text filled (not in ``own``, the cells the row states) that does not fit
    the row is not a statement: the system's share stands."""
    stated, nodes = (
        None if cell_number(r, k) is None else cell_int(r, k, minimum=0)
        for k in ("critic_gpus", "critic_nodes")
    )
    if stated is None and nodes is not None:
        stated = nodes * node
    if stated == 0:
        return 0, False  # stated: the critic on the trainer's pool
    if stated is not None:
        said = (r.get("critic_gpus") or "").strip()
        where = f"critic_gpus={stated}" if said else f"critic_nodes={nodes}"
        problem = ""
        if not has_critic:
            problem = f"{where}: a critic's pool needs a critic (has_critic=yes, PPO)"
        elif not colocated:
            problem = (
                f"{where}: a critic's own pool beside placement=disaggregated is not priced; "
                "allowed: placement=colocated (the actor's pool generates and trains)"
            )
        elif not 1 <= stated < n:
            problem = f"{where}: must leave the actor GPUs of num_gpus={n}"
        if not problem:
            return stated, False
        if "critic_gpus" in own or "critic_nodes" in own:
            raise Unpredictable(problem)
    share = CRITIC_POOL_SYSTEMS.get(system)
    if share is None or not has_critic or not colocated:
        return 0, False
    whole = round(n / node * share) * node  # whole nodes, as the server is launched
    return (whole, True) if 1 <= whole < n else (0, False)


def reward_model_default(system: str, has_critic: bool) -> bool:
    """Whether a row that does not say scores its samples with a reward model."""
    return has_critic and system in REWARD_MODEL_SYSTEMS


#: systems whose recipes keep a KL term to a reference model unless a row says otherwise
#: (its forward over every sample): NeMo-RL's example configs
#: (``loss_fn.reference_policy_kl_penalty: 0.01``), OpenRLHF (``--init_kl_coef`` 0.01) and
#: DeepSpeed-Chat's step 3 (``--init_kl_coef`` 0.02), NeMo-Aligner's PPO
#: (``initial_policy_kl_penalty`` 0.01). verl creates a reference only with
#: ``use_kl_loss`` or ``use_kl_in_reward`` (both off by default); AReaL's default has none
REFERENCE_SYSTEMS = (
    "nemo-rl-megatron",
    "nemo-rl-dtensor",
    "openrlhf-deepspeed",
    "deepspeed-chat",
    "nemo-aligner",
)


#: systems that pad every prompt to the prompt budget before generating: DeepSpeed-Chat's
#: ``DataCollatorRLHF`` pads each batch's prompts to ``max_prompt_seq_len`` (left padding), and
#: the generate call, the four models' experience passes and the training passes all run
#: that padded prompt (microsoft/DeepSpeedExamples, applications/DeepSpeed-Chat/dschat/utils/
#: data/data_utils.py and dschat/rlhf/ppo_trainer.py)
PROMPT_PADDED_SYSTEMS = ("deepspeed-chat",)


def padded_prompt(system: str, max_seq: float | None, cap_cell: int | None) -> float | None:
    """The prompt tokens a system that pads prompts to its budget computes per sample: the
    budget ``max_seq_len - max_gen_len`` where the row states both; None elsewhere."""
    if system not in PROMPT_PADDED_SYSTEMS or not max_seq or cap_cell is None:
        return None
    budget = max_seq - cap_cell
    return budget if budget >= 1 else None


#: the last verl release whose rollout config defaults to ``enforce_eager: True`` (with
#: ``free_cache_engine: True``, which asserted it); v0.6.0 (PR #2956, 2025-08-08) turned vLLM's
#: CUDA graphs on by default
VERL_EAGER_UNTIL = (0, 5)
_VERL_VERSION = re.compile(r"\bverl[\s_=:(-]{0,3}v?(\d+)[._](\d+)(?:[._]\d+)?\b")


def eager_default(system: str, r: dict[str, str]) -> bool:
    """Whether a row that does not say runs its rollout without CUDA graphs: a verl run whose
    text names a verl release up to :data:`VERL_EAGER_UNTIL` (one release, or several that
    agree) and no SGLang rollout (verl never handed the flag to SGLang); a TRL run in
    transformers' ``generate`` (:func:`trl_transformers_generate`)."""
    if trl_transformers_generate(system, r):
        return True  # transformers' generate launches every layer's kernels (no CUDA graphs)
    if not system.startswith("verl"):
        return False
    text = _said(r)
    text = text.lower()
    found = {(int(a), int(b)) for a, b in _VERL_VERSION.findall(text)}
    return "sglang" not in text and {v <= VERL_EAGER_UNTIL for v in found} == {True}
