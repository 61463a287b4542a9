"""The one typed run configuration.

Every default of a run lives here, once. Units are in the names (``num_prompts``,
``samples_per_prompt``, ``max_response_tokens``). Configs load from YAML (a path or any
fsspec URL) and dump back to YAML; every error in a config is reported at once, as a
:class:`rpeg.errors.ConfigError` whose problems name the dotted field and the allowed values.

Later layers extend these sections rather than adding their own defaults elsewhere.
This module is pure: no torch, dask or prefect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rpeg.errors import ConfigError, Problem

AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"]  # rpeg.ir.recipes
KLEstimator = Literal["k1", "k2", "k3"]
LossAggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
Precision = Literal["fp32", "bf16", "fp16", "fp8"]


class Section(BaseModel):
    """Base of every config section: typed, no unknown keys, validated on assignment, finite
    numbers only (``lr: .inf`` or ``nan`` is refused: it only ever produces NaN weights)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False
    )


class ModelConfig(Section):
    """The policy model (and, by default, the reference and critic trunks)."""

    name: str = Field(
        "rpeg-tiny", description="catalog name (rpeg/specs models) used by the performance model"
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


RolloutCorrectionMode = Literal["none", "token_tis", "seq_tis", "token_mis", "seq_mis", "icepop"]

#: each rollout-correction mode's bounds ``(low, high)`` on the ratio ``pi_train / pi_rollout``
#: when the config leaves them unset (docs/engine.md "Rollout/trainer mismatch" gives the
#: sources): TIS truncates at 2 (verl's ``rollout_is_threshold`` default; Yao et al. 2025's
#: TIS cap), the masked modes keep ``[1/2, 2]`` (verl's rejection bounds: upper = the IS
#: threshold, lower = its reciprocal), IcePop keeps ``[0.5, 5]``. ``None``: no bound.
ROLLOUT_CORRECTION_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "none": (None, None),
    "token_tis": (None, 2.0),
    "seq_tis": (None, 2.0),
    "token_mis": (0.5, 2.0),
    "seq_mis": (0.5, 2.0),
    "icepop": (0.5, 5.0),
}


class RolloutCorrectionConfig(Section):
    """How the loss corrects for the gap between the rollout engine's log-probs and the
    trainer's (rpeg.runtime.algorithms.mismatch). The ratio is ``rho = pi_train /
    pi_rollout`` = ``exp(old - behaviour)`` per token (``old``: the trainer's log-probs at
    the weights before the step's update)."""

    mode: RolloutCorrectionMode = Field(
        "token_tis",
        description="none; token_tis: loss x min(rho_t, high); seq_tis: x min(prod_t rho_t, "
        "high); token_mis: x rho_t, tokens with rho_t outside [low, high] dropped; seq_mis: "
        "x prod rho, sequences whose product leaves [low, high] dropped; icepop: token_mis "
        "with IcePop's bounds",
    )
    low: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="lower ratio bound of the masked modes; None = the mode's default "
        "(ROLLOUT_CORRECTION_BOUNDS: 0.5)",
    )
    high: float | None = Field(
        None,
        ge=1.0,
        description="TIS cap / upper ratio bound of the masked modes; None = the mode's "
        "default (2.0; icepop 5.0)",
    )
    apply_to: Literal["stale", "all"] = Field(
        "stale",
        description="stale = correct a step's batch only when it holds samples of an older "
        "policy version (the engine's numerics alone are not corrected); all = every step",
    )
    measure: Literal["first_update", "forward"] = Field(
        "first_update",
        description="how the rollout/trainer mismatch (logprob_mismatch_*) is measured on "
        "steps that reuse the engine's log-probs as the old ones: first_update = on the rows "
        "of the step's first optimizer update, whose forward runs at the old weights (no extra "
        "forward; a random 1/train_minibatches of the rows); forward = recompute the old "
        "log-probs with a forward every step (every token). Steps that recompute anyway "
        "(stale rows, recompute_old_logprobs, apply_to=all) measure every token",
    )
    mismatch_threshold: float = Field(
        0.2,
        gt=0.0,
        description="logprob_mismatch_frac_over counts tokens with |rho - 1| above this",
    )

    @model_validator(mode="after")
    def _bounds_for_mode(self) -> RolloutCorrectionConfig:
        if self.low is not None and self.mode in ("none", "token_tis", "seq_tis"):
            raise ValueError(
                f"low is a bound of the masked modes (token_mis, seq_mis, icepop); "
                f"mode {self.mode!r} does not use it"
            )
        return self

    def bounds(self) -> tuple[float | None, float | None]:
        """``(low, high)``: the configured bounds, else the mode's defaults."""
        low, high = ROLLOUT_CORRECTION_BOUNDS[self.mode]
        return (low if self.low is None else self.low), (high if self.high is None else self.high)


class AlgorithmConfig(Section):
    """The RL algorithm and its loss options (DAPO-style options are plain fields)."""

    name: AlgorithmName = "grpo"
    use_reference: bool = Field(True, description="keep a frozen reference model for a KL term")
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="weight of the KL penalty: in the loss or the reward, as the "
        "algorithm's recipe says (rpeg.ir.recipes; none for dapo)",
    )
    kl_estimator: KLEstimator = "k3"
    clip_low: float = Field(0.2, gt=0.0, lt=1.0, description="PPO ratio clip: 1 - clip_low")
    clip_high: float = Field(
        0.2, gt=0.0, description="PPO ratio clip: 1 + clip_high (DAPO clip-higher: 0.28)"
    )
    dual_clip: float | None = Field(
        None, gt=1.0, description="dual-clip bound c for negative advantages"
    )
    loss_aggregation: LossAggregation = "token_mean"
    normalize_advantage_std: bool = Field(
        True, description="GRPO: divide by group std (False = Dr.GRPO)"
    )
    entropy_coef: float = Field(0.0, ge=0.0)
    gamma: float = Field(1.0, gt=0.0, le=1.0, description="PPO/GAE discount")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    value_clip: float | None = Field(0.2, gt=0.0)
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="off-policy correction of the rollout engine's samples (TIS, masked IS, "
        "IcePop) and the mismatch measurement",
    )
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal"
    )
    overlong_penalty_tokens: int = Field(
        0, ge=0, description="DAPO soft overlong punishment window"
    )
    share_actor_critic: bool = Field(
        False, description="PPO: value head on the actor's trunk (one forward)"
    )
    vf_coef: float = Field(
        0.5, ge=0.0, description="weight of the value loss when actor and critic share a trunk"
    )
    ppo_epochs: int = Field(1, ge=1, description="passes over the batch per RL step")
    recompute_old_logprobs: bool = Field(
        False,
        description="recompute old log-probs with a forward pass even for on-policy samples "
        "(stale samples always get them recomputed: decoupled PPO's proximal policy)",
    )

    @model_validator(mode="before")
    @classmethod
    def _replaced_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            old = [k for k in ("off_policy_correction", "tis_cap") if k in data]
            if old:
                raise ValueError(
                    f"{', '.join(old)} replaced by rollout_correction: "
                    "{mode: token_tis | seq_tis | token_mis | seq_mis | icepop | none, "
                    "high: <the old tis_cap>}"
                )
        return data


class WorkloadConfig(Section):
    """What one RL step processes."""

    num_prompts: int = Field(16, ge=1, description="prompts per RL step")
    samples_per_prompt: int = Field(8, ge=1, description="responses sampled per prompt (the group)")
    max_prompt_tokens: int = Field(
        32,
        ge=1,
        description="longest prompt in tokens; with a data file and this field unset, "
        "rpeg train sets it to the longest prompt of the data (after the chat template)",
    )
    mean_prompt_tokens: float | None = Field(
        None, gt=0, description="for the performance model; None = max_prompt_tokens"
    )
    max_response_tokens: int = Field(16, ge=1)
    mean_response_tokens: float | None = Field(
        None,
        gt=0,
        description="for the performance model; None = assume a distribution from the cap",
    )
    train_minibatches: int = Field(4, ge=1, description="optimizer steps per RL step")
    micro_batch_size: int = Field(64, ge=1, description="samples per forward/backward micro-batch")
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="token budget of a micro-batch (rows x padded length), replacing "
        "micro_batch_size when set (verl ppo_max_token_len_per_gpu; rpeg.runtime.micro_batches)",
    )
    precision: Precision = "fp32"
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = no top-k filtering")

    @property
    def samples_per_step(self) -> int:
        return self.num_prompts * self.samples_per_prompt

    @model_validator(mode="after")
    def _minibatches_divide(self) -> WorkloadConfig:
        if self.samples_per_step % self.train_minibatches:
            raise ValueError(
                f"train_minibatches={self.train_minibatches} must divide "
                f"num_prompts*samples_per_prompt={self.samples_per_step}"
            )
        return self


class TaskConfig(Section):
    """Where prompts and reference answers come from, and how responses are rewarded."""

    kind: Literal["arithmetic", "countdown", "jsonl", "parquet", "hf"] = Field(
        "arithmetic",
        description="arithmetic | countdown: built-in synthetic tasks; jsonl | parquet: a "
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
        description="dotted path of the reference answer in a row, e.g. "
        "reward_model.ground_truth (verl). None = answer or solution (GSM8K: the text "
        "after ####)",
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
    heldout_size: int = Field(64, ge=0)
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

    @model_validator(mode="after")
    def _url_for_files(self) -> TaskConfig:
        if self.kind in ("jsonl", "parquet", "hf") and not self.url:
            raise ValueError(f"kind={self.kind!r} needs url (an fsspec URL)")
        return self


class OptimConfig(Section):
    lr: float = Field(1e-4, gt=0.0)
    critic_lr: float = Field(1e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    warmup_sft_steps: int | None = Field(
        None,
        ge=0,
        description="supervised warm-up steps before RL (cached on disk). None = 150 for the "
        "built-in tiny model (random init; 150 leaves it at ~35% held-out accuracy) and 0 for a "
        "model loaded from model.path",
    )
    warmup_sft_lr: float = Field(1e-3, gt=0.0)
    warmup_sft_batch_size: int = Field(64, ge=1, description="examples per warm-up step")


#: the most devices a run or a plan may name: 131,072 (beyond the largest GPU clusters built;
#: ``rpeg plan`` searched 16k devices in ~30 s and 131k in ~150 s on a 2-core CPU)
MAX_DEVICES = 1 << 17


class ClusterConfig(Section):
    """Hardware the run plans for and runs on."""

    name: str = Field("local-cpu", description="catalog cluster name (rpeg/specs clusters)")
    num_devices: int | None = Field(
        None,
        ge=1,
        le=MAX_DEVICES,
        description="devices to use; None = all of the cluster (at most MAX_DEVICES)",
    )
    address: str | None = Field(
        None, description="existing Dask scheduler, e.g. tcp://host:8786; None = LocalCluster"
    )
    n_workers: int = Field(2, ge=1, description="LocalCluster worker processes")
    threads_per_worker: int = Field(1, ge=1)
    device_type: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="LocalCluster kind: cpu = one process per device slot; cuda = dask-cuda "
        "LocalCUDACluster, one worker per visible GPU (gpu extra)",
    )
    worker_memory: str = Field(
        "auto",
        description="memory limit per LocalCluster worker: auto = the machine's memory (or "
        "cgroup limit) split over the workers, a size such as 8GiB, or 0 = no limit",
    )
    dashboard_address: str | None = Field(
        None,
        description="Dask dashboard, e.g. 127.0.0.1:8787; None = no dashboard. Naming a "
        "non-loopback interface exposes it without authentication",
    )
    direct_to_workers: bool = Field(
        True,
        description="the driver calls the ranks' actors on their workers directly (false: "
        "through the scheduler, for workers the driver's machine cannot reach; each call then "
        "takes two more hops)",
    )
    tls_ca_file: str | None = Field(None, description="CA bundle for a tls:// scheduler")
    tls_cert_file: str | None = Field(None, description="client certificate (tls://)")
    tls_key_file: str | None = Field(None, description="client private key (tls://)")


class RuntimeConfig(Section):
    steps: int = Field(60, ge=1, description="RL steps to run")
    seed: int = 0
    max_staleness: int = Field(0, ge=0, description="bound k on policy-version lag (0 = on-policy)")
    checkpoint_url: str | None = Field(
        None,
        description="fsspec URL; None = no checkpoints. Each run writes under "
        "<checkpoint_url>/<run_id>/, so runs sharing the URL keep each other's checkpoints",
    )
    run_id: str | None = Field(
        None,
        description="id of this run's checkpoints; None = a new id, or with resume the one "
        "run found at checkpoint_url",
    )
    resume_from: str | None = Field(
        None,
        description="start from this checkpoint (a step folder, a run folder, or a checkpoint "
        "URL holding one run) of any run; later checkpoints go under this run's id",
    )
    checkpoint_every: int = Field(10, ge=1)
    keep_last: int = Field(3, ge=1)
    resume: bool = False
    worker_stall_warn_s: float = Field(
        60.0, gt=0, description="distributed: warn when a worker has not answered a ping this long"
    )
    worker_lost_after_s: float = Field(
        300.0,
        ge=0,
        description="distributed: a worker silent this long (stopped, hung) is killed and "
        "handled as lost (the run recovers from its last checkpoint); 0 = never",
    )
    degenerate_steps_limit: int = Field(
        20,
        ge=0,
        description="stop after this many consecutive steps that cannot move the policy (all "
        "advantages 0, non-finite or huge rewards, every update skipped; each is warned "
        "about); 0 = warn only (rpeg.runtime.degenerate)",
    )
    allow_change: list[Literal["algorithm", "staleness", "layout", "model"]] = Field(
        default_factory=list,
        description="with resume: what may differ from the checkpoint's commit marker "
        "(algorithm, staleness, layout -- resharded, data-parallel replicas only -- or model); "
        "anything else that differs is refused before the run starts (docs/runtime.md Faults)",
    )
    output_dir: str = Field("runs/latest", description="metrics, plots, summaries")
    log_samples_every: int = Field(
        1,
        ge=0,
        description="write the step's samples (prompt, response, reference answer, rewards, "
        "advantage, length, policy version) to <output_dir>/samples.jsonl every this many "
        "steps and print a few; 0 = never",
    )
    export_hf: bool = Field(
        False,
        description="at every checkpoint also write the policy as a Hugging Face folder "
        "<output_dir>/hf/step-NNNNNNNN (as `rpeg export`); a failed export warns, the run "
        "and its checkpoint go on",
    )
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] | None = Field(
        None,
        description="where per-step metrics go besides metrics.jsonl (both runtimes): "
        "tensorboard (<output_dir>/tb), wandb (offline unless WANDB_MODE/WANDB_API_KEY), "
        "mlflow (MLFLOW_TRACKING_URI or sqlite <output_dir>/mlflow.db); a named one not installed is "
        "refused before start; unset = [tensorboard] when installed",
    )
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per process")
    cpu_binding: Literal["auto", "spread", "none"] = Field(
        "auto",
        description="distributed, CPU ranks: spread = bind each worker process of the run to "
        "its own cores (its slot among the run's workers on that host; rpeg.runtime."
        "cpu_binding); auto = spread only where the run has more workers on a host than the "
        "host has cores; none = leave placement to the OS scheduler",
    )
    engine: Literal["auto", "torch", "vllm"] = Field(
        "auto",
        description="generation engine; auto = vllm where generation runs on CUDA and vllm "
        "is installed, else torch (rpeg.runtime.engines.choice)",
    )
    step_retries: int = Field(
        2, ge=0, description="distributed: recoveries from the last checkpoint after a worker dies"
    )
    collective_timeout_s: float | None = Field(
        None,
        gt=0.0,
        le=7 * 24 * 3600.0,
        description="distributed: seconds a rank waits at a collective before its process group "
        "gives up (NCCL's watchdog then aborts the run); None = the larger of 30 min and 4x "
        "the step the plan predicts (rpeg.runtime.actors.predicted): a dp rank that finished "
        "its rollouts early waits for the slowest one at the next collective",
    )


class SearchConfig(Section):
    """The plan optimizer (``rpeg plan``): budget, determinism, mode."""

    mode: Literal["auto", "exhaustive", "decompose"] = Field(
        "auto",
        description="auto = exhaustive enumeration when the space is small, else decomposed search",
    )
    seed: int = Field(0, description="seed of the annealing refinement (same seed, same plan)")
    max_candidates: int = Field(0, ge=0, description="cap on full-plan evaluations; 0 = no cap")
    time_budget_s: float = Field(
        0.0, ge=0.0, description="stop exploring new cells after this; 0 = no budget"
    )
    top_alternatives: int = Field(5, ge=0, description="alternatives shown in the report")


class RunConfig(Section):
    """One run: model, algorithm, workload, task, optimizer, cluster, plan, runtime."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    plan: str | dict[str, Any] | None = Field(
        None,
        description="an execution plan (path/URL of plan YAML, or inline); None = let the runtime choose",
    )

    @property
    def warmup_sft_steps(self) -> int:
        """Warm-up steps actually run (resolves ``optim.warmup_sft_steps=None``)."""
        if self.optim.warmup_sft_steps is not None:
            return self.optim.warmup_sft_steps
        return 150 if self.model.path is None else 0

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, *, source: str = "") -> RunConfig:
        """Validate ``data``; raise :class:`ConfigError` listing every problem."""
        try:
            return cls.model_validate(data or {})
        except ValidationError as exc:
            raise ConfigError(problems_from_pydantic(exc), title=_title(source)) from None

    @classmethod
    def from_yaml(cls, text_or_path: str | Path) -> RunConfig:
        """Load from a YAML path, fsspec URL, or a YAML string."""
        text, source = read_text_or_path(text_or_path)
        try:
            data = safe_yaml(text, source)
        except yaml.YAMLError as exc:
            raise ConfigError([Problem(source or "yaml", f"not valid YAML: {exc}")]) from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError(
                [Problem(source or "yaml", "top level must be a mapping of sections")]
            )
        return cls.from_dict(data, source=source)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def with_overrides(self, overrides: dict[str, Any]) -> RunConfig:
        """Apply dotted overrides such as ``{"runtime.steps": 5}``, validating all at once.
        Fields left at their defaults stay unset (``model_fields_set``): a default that
        follows the data (``workload.max_prompt_tokens``) still can."""
        data = self.model_dump(mode="json", exclude_unset=True)
        full = self.model_dump(mode="json")
        problems: list[Problem] = []
        for dotted, value in overrides.items():
            node, known = data, full
            parts = dotted.split(".")
            for part in parts[:-1]:
                if not isinstance(known, dict) or part not in known:
                    problems.append(Problem(dotted, f"unknown section {part!r}"))
                    break
                if not isinstance(node.get(part), dict):
                    node[part] = {}  # a section left at its defaults: set only what is named
                node, known = node[part], known[part]
            else:
                node[parts[-1]] = value
        try:
            out = RunConfig.from_dict(data, source="overrides")
        except ConfigError as exc:
            raise ConfigError(problems + list(exc.problems), title="invalid overrides") from None
        if problems:
            raise ConfigError(problems, title="invalid overrides")
        return out


def _title(source: str) -> str:
    return f"invalid configuration {source}".strip()


def problems_from_pydantic(exc: ValidationError) -> list[Problem]:
    """Turn pydantic's error list into :class:`Problem` s with dotted paths."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        ctx = err.get("ctx") or {}
        if err["type"] == "literal_error" and "expected" in ctx:
            msg = f"got {err.get('input')!r}; allowed: {ctx['expected']}"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif err["type"].startswith(("greater", "less")):
            msg = f"{msg} (got {err.get('input')!r})"
        out.append(Problem(loc, msg))
    return out


#: a run config's YAML: at most this many bytes and alias references (``*name``): an alias
#: expands to its anchor's whole value, so nine levels of ten aliases each are a billion
#: nodes ("billion laughs") that exhaust memory when anything walks them (issue 28:
#: ``with_overrides`` -> ``model_dump`` did); a hand-written config uses a handful
MAX_YAML_BYTES = 16 * 2**20
MAX_YAML_ALIASES = 100


def safe_yaml(text: str, source: str = "") -> Any:
    """``yaml.safe_load`` of a config with the size and alias limits above (a
    :class:`ConfigError` naming the limit, before anything is expanded)."""
    where = source or "yaml"
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(
            [Problem(where, f"{len(text)} bytes of YAML; a config holds at most {MAX_YAML_BYTES}")]
        )
    aliases = sum(
        isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(text, Loader=yaml.SafeLoader)
    )
    if aliases > MAX_YAML_ALIASES:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"{aliases} YAML aliases (*name); at most {MAX_YAML_ALIASES} (each expands "
                    "to its anchor's whole value: write the values out)",
                )
            ]
        )
    return yaml.safe_load(text)


def read_text_or_path(text_or_path: str | Path) -> tuple[str, str]:
    """Return (text, source). Accepts a local path, an fsspec URL, or literal YAML text."""
    s = str(text_or_path)
    if "\n" in s or (
        not isinstance(text_or_path, Path) and ":" in s and "://" not in s and not Path(s).exists()
    ):
        return s, ""
    if "://" in s:
        import fsspec  # fsspec is pure Python and allowed in pure layers

        try:
            with fsspec.open(s, "r") as fh:
                return fh.read(), s
        except FileNotFoundError:
            raise ConfigError([Problem(s, "file not found")]) from None
    p = Path(s)
    if not p.exists():
        raise ConfigError([Problem(s, "file not found")])
    if p.is_dir():
        raise ConfigError([Problem(s, "is a folder; expected a YAML file")])
    return p.read_text(), s
