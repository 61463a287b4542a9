"""What a run trains and on what: the model, one RL step's workload (prompts, samples per
prompt, token caps, micro-batches, sampling) and the task (data, template, rewards). Each
default written once, here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rpeg import defaults
from rpeg.config.section import Section

Precision = Literal["fp32", "bf16", "fp16", "fp8"]


#: the Linear layers of the built-in tiny model (a Llama decoder; its LM head is tied to the
#: embeddings), the names ``model.lora.target_modules`` may take without ``model.path``
TINY_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSection(Section):
    """LoRA adapters on the policy (peft; docs/lora.md): only the adapters train, are
    checkpointed and optimised; weight sync sends the merged weights under the base names."""

    rank: int = Field(8, ge=1, le=4096, description="r, the adapters' inner dimension")
    alpha: float = Field(16.0, gt=0.0, description="lora_alpha; the update is scaled by alpha/rank")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        min_length=1,
        description="names of the Linear layers that get adapters (the last part of a module's "
        "name, e.g. q_proj; checked against the model before the run starts)",
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input")

    @property
    def scale(self) -> float:
        """What B @ A is multiplied by (peft's ``scaling``: alpha / rank)."""
        return self.alpha / self.rank


class ModelConfig(Section):
    """The policy model (and, by default, the reference and critic trunks)."""

    name: str = Field(
        "rpeg-tiny",
        description="catalog name (rpeg/specs models) used by the performance model; left at "
        "this default with model.path set, the folder's config.json is priced instead",
    )
    path: str | None = Field(
        None,
        description="local path or fsspec URL of a Hugging Face model folder (safetensors); "
        "None = the built-in tiny model, created and warmed up by the project",
    )
    critic_path: str | None = Field(
        None, description="separate critic weights; None = start from the policy trunk"
    )
    reward_model_path: str | None = Field(
        None, description="a reward model instead of rule rewards"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny_shape: dict[str, int] | None = Field(
        None,
        description="override fields of the built-in tiny model's shape (e.g. {num_hidden_layers: 2})",
    )
    lora: LoraSection | None = Field(
        None,
        description="LoRA adapters on the policy: rank, alpha, target_modules, dropout "
        "(docs/lora.md); None = full fine-tuning",
    )

    @model_validator(mode="after")
    def _lora_targets(self) -> ModelConfig:
        if self.lora is None or self.path:  # a model folder: checked when it is loaded
            return self
        unknown = [m for m in self.lora.target_modules if m not in TINY_LINEAR_MODULES]
        if unknown:
            raise ValueError(
                f"lora.target_modules {unknown} are not Linear layers of the built-in model "
                f"(allowed: {', '.join(TINY_LINEAR_MODULES)})"
            )
        return self


#: the most samples one step may hold and the longest prompt or response cap (tokens): far
#: above any run (2**24 = 16.7M), low enough that the planner's arithmetic stays finite
#: (1e9 x 1e9 samples ended `rpeg plan` in a StatisticsError, issue 44)
MAX_SAMPLES_PER_STEP = 2**24
MAX_TOKENS = 2**24


class WorkloadConfig(Section):
    """What one RL step processes."""

    num_prompts: int = Field(defaults.NUM_PROMPTS, ge=1, description="prompts per RL step")
    samples_per_prompt: int = Field(
        defaults.SAMPLES_PER_PROMPT, ge=1, description="responses sampled per prompt (the group)"
    )
    max_prompt_tokens: int = Field(
        defaults.MAX_PROMPT_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        description="longest prompt in tokens; with a data file and this field unset, "
        "rpeg train sets it to the longest prompt of the data (after the chat template)",
    )
    mean_prompt_tokens: float | None = Field(
        None, gt=0, description="for the performance model; None = max_prompt_tokens"
    )
    max_response_tokens: int = Field(
        defaults.MAX_RESPONSE_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        description="longest response in tokens; less than the model's context (checked "
        "before start)",
    )
    mean_response_tokens: float | None = Field(
        None,
        gt=0,
        description="for the performance model; None = assume a distribution from the cap",
    )
    train_minibatches: int = Field(
        defaults.TRAIN_MINIBATCHES,
        ge=1,
        description="optimizer steps per RL step, each on a random 1/train_minibatches of the "
        "rows stratified by prompt (an equal share of every prompt's samples)",
    )
    micro_batch_size: int = Field(
        defaults.MICRO_BATCH_SIZE, ge=1, description="samples per forward/backward micro-batch"
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="token budget of a micro-batch (rows x padded length), replacing "
        "micro_batch_size when set (verl ppo_max_token_len_per_gpu; rpeg.runtime.micro_batches)",
    )
    precision: Precision = "fp32"
    temperature: float = Field(defaults.TEMPERATURE, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = no top-k filtering")

    @property
    def seq_packing(self) -> bool:
        """A role used on its own, outside a compiled unit, runs padded micro-batches:
        packing is a plan field (``UnitPlan.seq_packing``, docs/packing.md)."""
        return False

    @property
    def samples_per_step(self) -> int:
        return self.num_prompts * self.samples_per_prompt

    @model_validator(mode="after")
    def _within_limits(self) -> WorkloadConfig:
        if self.samples_per_step > MAX_SAMPLES_PER_STEP:
            raise ValueError(
                f"num_prompts*samples_per_prompt={self.samples_per_step} samples a step; at "
                f"most {MAX_SAMPLES_PER_STEP}"
            )
        return self

    @model_validator(mode="after")
    def _minibatches_divide(self) -> WorkloadConfig:
        if self.samples_per_step % self.train_minibatches:
            raise ValueError(
                f"train_minibatches={self.train_minibatches} must divide "
                f"num_prompts*samples_per_prompt={self.samples_per_step}"
            )
        return self


#: names of rpeg.runtime.envs' environments and tools (tests/multiturn checks they agree)
EnvName = Literal["tools"]
ToolName = Literal["calc"]


class MultiTurnConfig(Section):
    """Multi-turn rollouts with tools (docs/multiturn.md); ``env`` None = single turn."""

    env: EnvName | None = Field(
        None, description="the environment of multi-turn rollouts; None = one turn"
    )
    tools: list[ToolName] = Field(default_factory=lambda: ["calc"], description="tools offered")
    max_turns: int = Field(3, ge=1, le=64, description="model turns per sample, at most")
    max_turn_tokens: int = Field(32, ge=1, description="generated tokens per turn, at most")
    env_timeout_s: float = Field(5.0, gt=0.0, description="limit per environment call")
    env_concurrency: int = Field(8, ge=1, description="environment calls at once, at most")
    # what the performance model prices (rpeg.perf.turns; docs/multiturn.md "Pricing")
    env_latency_s: float = Field(
        defaults.ENV_LATENCY_S, ge=0.0, description="planning: seconds per environment call"
    )
    mean_turns: float | None = Field(
        None, ge=1.0, description="planning: mean model turns per sample; None = max_turns"
    )
    mean_turn_tokens: float | None = Field(
        None, gt=0.0, description="planning: mean generated tokens per turn; None = a prior"
    )
    observation_tokens: float = Field(
        defaults.MEAN_OBSERVATION_TOKENS, ge=0.0, description="planning: tokens per observation"
    )

    @model_validator(mode="after")
    def _planning_means_within_caps(self) -> MultiTurnConfig:
        if self.mean_turns is not None and self.mean_turns > self.max_turns:
            raise ValueError(f"mean_turns={self.mean_turns} exceeds max_turns={self.max_turns}")
        if self.mean_turn_tokens is not None and self.mean_turn_tokens > self.max_turn_tokens:
            raise ValueError(
                f"mean_turn_tokens={self.mean_turn_tokens} exceeds "
                f"max_turn_tokens={self.max_turn_tokens}"
            )
        return self

    warmup_tool_share: float = Field(
        0.5, ge=0.0, le=1.0, description="tool_arithmetic: share of warm-up transcripts with a call"
    )
    chat_template: Literal["auto", "none"] = Field(
        "auto",
        description="auto = when the tokenizer has a chat template, render the prompt with it "
        "and wrap each observation as a message (rpeg.runtime.envs.chat); none = plain text",
    )
    observation_role: Literal["tool", "user"] = Field(
        "tool", description="the role of an observation's message under a chat template"
    )


class TaskConfig(Section):
    """Where prompts and reference answers come from, and how responses are rewarded."""

    kind: Literal["arithmetic", "countdown", "tool_arithmetic", "jsonl", "parquet", "hf"] = Field(
        "arithmetic",
        description="arithmetic | countdown: built-in synthetic tasks; tool_arithmetic: word "
        "problems solved with a calculator tool (multi-turn: task.multiturn); jsonl | parquet: a "
        "file; hf: a Hugging Face datasets folder (save_to_disk) or a folder of "
        "parquet/jsonl files (rpeg.runtime.datasets)",
    )
    url: str | None = Field(
        None,
        description="fsspec URL of the JSONL/Parquet file or datasets folder; a folder may "
        "name its split as <folder>#<split> (default: train)",
    )
    prompt_key: str | None = Field(
        None,
        description="column holding the prompt: text, or a list of chat messages "
        "({role, content}; verl and TRL conversational data). None = question, problem or "
        "prompt, the first present",
    )
    answer_key: str | None = Field(
        None,
        description="dotted path of the reference answer in a row, e.g. extra_info.answer. "
        "None = answer, solution or reward_model.ground_truth (verl), the first present "
        "(GSM8K: the text after ####)",
    )
    system_prompt: str | None = Field(
        None, description="a system message put before every prompt that has none"
    )
    chat_template: str = Field(
        "auto",
        description="auto = apply the tokenizer's chat template (with the generation prompt) "
        "when it has one; none = the prompt text as is; or the path of a Jinja template file",
    )
    overlong: Literal["filter", "truncate", "error"] = Field(
        "filter",
        description="prompts longer than workload.max_prompt_tokens (counted after the chat "
        "template): filter = drop them and say how many; truncate = keep their last tokens; "
        "error = refuse the run",
    )
    prompt_template: str = Field(
        "{question}", description="text prompts: the text given to the model ({question})"
    )
    difficulty: int = Field(1, ge=1, le=5, description="synthetic tasks: 1 = easiest")
    rewards: list[str] = Field(
        default_factory=lambda: ["exact_numeric"],
        description="reward names: built-in, or registered by a module of reward_modules",
    )
    reward_modules: list[str] = Field(
        default_factory=list,
        description="Python modules that register rewards (rpeg.runtime.rewards."
        "register_reward) when imported; imported by the preflight, the local trainer and "
        "every worker's actors, so they must be importable there (installed or on PYTHONPATH)",
    )
    heldout_size: int = Field(
        64,
        ge=0,
        description="prompts held out for validation: taken out of the training data "
        "(at most half of a file's rows) when val_url is not set",
    )
    val_url: str | None = Field(
        None,
        description="a separate validation file (verl's data.val_files): any data kind the "
        "training data accepts (jsonl, parquet, a datasets folder; read with the same "
        "prompt_key / answer_key / chat template); None = hold heldout_size prompts out of "
        "the training file",
    )
    reward_by_source: dict[str, str | list[str]] = Field(
        default_factory=lambda: dict(defaults.REWARD_BY_SOURCE),
        description="rewards by a row's data_source column (verl's default_compute_score): "
        "{source or fnmatch pattern: reward name(s)}; a matching row is scored by them in "
        "place of the correctness rules of rewards (exact_numeric, math_equivalence, "
        "countdown); {} = off",
    )
    seed: int = 0
    max_reward_error_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="fail the step when more than this share of a batch's reward calls raise "
        "(a reward that always errors would otherwise train on zeros)",
    )
    reward_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="wall-clock limit per sample for rewards run in the verifier process pool",
    )
    multiturn: MultiTurnConfig = Field(
        default_factory=MultiTurnConfig,
        description="multi-turn rollouts with tools: env, tools, max_turns, max_turn_tokens, "
        "env_timeout_s, env_concurrency, warmup_tool_share, chat_template, observation_role; "
        "for the performance model: env_latency_s, mean_turns, mean_turn_tokens, "
        "observation_tokens (docs/multiturn.md)",
    )

    @model_validator(mode="after")
    def _url_for_files(self) -> TaskConfig:
        if self.kind in ("jsonl", "parquet", "hf") and not self.url:
            raise ValueError(f"kind={self.kind!r} needs url (an fsspec URL)")
        mt = self.multiturn
        if mt.env and mt.chat_template == "auto" and self.chat_template != "auto":
            raise ValueError(
                "multiturn.chat_template='auto' applies the tokenizer's template per turn but "
                f"chat_template={self.chat_template!r}; with it multiturn.chat_template allows: "
                "none"
            )
        if self.kind == "tool_arithmetic" and self.multiturn.env is None:
            raise ValueError("kind='tool_arithmetic' needs multiturn.env (allowed: tools)")
        if self.kind == "tool_arithmetic" and "tool_final_answer" not in self.rewards:
            raise ValueError(
                "kind='tool_arithmetic' is scored on the answer after the tool's result: rewards "
                "needs tool_final_answer (with reward_modules: [rpeg.runtime.envs.answers])"
            )
        return self
